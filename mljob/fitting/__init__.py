"""Keras's `model.fit`, made distributed where Keras 3's cannot run."""
