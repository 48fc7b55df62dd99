"""Every name mljob.training takes from Keras that Keras does not export: its private
modules (`keras.src...`) and private attributes, in one place.

A Keras release may move any of them; `setup.py` pins `keras` to the minor range the
suite passes with, and tests/mljob/test_keras_private.py imports each one here and
fails naming the one a release moved. Whoever raises the pin runs that test first.
"""
from __future__ import annotations

from keras.src import tree
from keras.src.losses.losses import LossFunctionWrapper
from keras.src.trainers import compile_utils

__all__ = ["tree", "LossFunctionWrapper", "compile_utils"]
