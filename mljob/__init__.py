"""mljob's core: what the trainer, the launcher and the predictor share.

Importing it (or any module below but the training library) imports no TensorFlow:
storage (`storage`), the cluster parser (`cluster`), process helpers (`procs`), one
error base and the exit statuses (`errors`), the wire contracts (`contracts`) and the
machine catalogue (`machines`). The package is named after the distribution, so a
user's own package (Cloud ML's convention calls it `trainer`) can never shadow it.
"""
__version__ = "0.1.0"
