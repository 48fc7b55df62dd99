"""The server's process, as TF Serving's model_servers/main.cc and server.cc hold it:
its flags (`flags`), what they name read and checked before TensorFlow loads, then the
models, the batcher and the two APIs started (`process`), and the ports, signals and
front ends (`listen`).

`tensorflow_model_server` (the console script) calls `main_model_server`."""
from __future__ import annotations


def main_model_server(argv=None) -> int:
    """The `tensorflow_model_server` console script (predict.serving.process)."""
    from predict.serving.process import main_model_server as main
    return main(argv)
