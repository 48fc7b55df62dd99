"""Generate predict/serving_api/: TF Serving's API protos (messages and gRPC stubs) from
the .proto files of a tensorflow/serving release, vendored so that the server needs
neither the `tensorflow-serving-api` package (which requires the full `tensorflow`
distribution) nor anything but grpcio and protobuf beside the TensorFlow it serves with.

    git -C SERVING_CHECKOUT archive 2.20.0 tensorflow_serving/apis \\
        tensorflow_serving/config LICENSE | tar -x -C /tmp/tfs-src
    python3 -m venv /tmp/gt && /tmp/gt/bin/pip install grpcio-tools==1.75.1
    python3 tools/serving_protos.py /tmp/tfs-src --protoc-python /tmp/gt/bin/python

grpcio-tools 1.75.1 bundles protoc 31.1, whose Python code runs on protobuf 6.31.1 and
later (the range TensorFlow 2.21 allows, and the version the released
`tensorflow-serving-api` 2.21.0 was generated with). The TensorFlow protos they import
(`tensorflow/core/framework/tensor.proto`, `example.proto`, `meta_graph.proto`, ...) are
not vendored: the generated code imports them from the installed TensorFlow
(`tensorflow.core.*_pb2`), as TF Serving's own package does, so one TensorProto class is
shared with the TensorFlow that loads the model. protoc reads them here as a descriptor
set taken from that TensorFlow. Imports of `tensorflow_serving.X` (and the module the
classes name as theirs) are rewritten to `predict.serving_api.X`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "predict", "serving_api")
PROTOS = [f"tensorflow_serving/apis/{n}.proto" for n in (
    "classification", "get_model_metadata", "get_model_status", "inference", "input",
    "logging", "model", "model_management", "model_service", "predict", "prediction_log",
    "prediction_service", "regression", "session_service", "status")] + [
    f"tensorflow_serving/config/{n}.proto" for n in (
        "file_system_storage_path_source", "log_collector_config", "logging_config",
        "model_server_config", "platform_config")]
GRPC = ["tensorflow_serving/apis/model_service.proto",
        "tensorflow_serving/apis/prediction_service.proto"]
TF_IMPORTS = ["tensorflow.core.example.example_pb2", "tensorflow.core.framework.tensor_pb2",
              "tensorflow.core.protobuf.config_pb2", "tensorflow.core.protobuf.error_codes_pb2",
              "tensorflow.core.protobuf.meta_graph_pb2",
              "tensorflow.core.protobuf.named_tensor_pb2"]


def tensorflow_descriptor_set(path: str) -> None:
    """The installed TensorFlow's protos that TF Serving's import, with every file they
    depend on, as a FileDescriptorSet."""
    from google.protobuf import descriptor_pb2
    seen: dict[str, object] = {}

    def add(fd) -> None:
        if fd.name in seen:
            return
        for dep in fd.dependencies:
            add(dep)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        seen[fd.name] = proto

    for name in TF_IMPORTS:
        add(importlib.import_module(name).DESCRIPTOR)
    out = descriptor_pb2.FileDescriptorSet(file=list(seen.values()))
    with open(path, "wb") as f:
        f.write(out.SerializeToString())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", help="a folder holding tensorflow_serving/ of a release")
    p.add_argument("--protoc-python", default=sys.executable,
                   help="a Python with grpcio-tools (and its protoc) installed")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        descriptors = os.path.join(tmp, "tensorflow.pb")
        tensorflow_descriptor_set(descriptors)
        gen = os.path.join(tmp, "gen")
        os.makedirs(gen)
        subprocess.run([args.protoc_python, "-m", "grpc_tools.protoc", f"-I{args.source}",
                        f"--descriptor_set_in={descriptors}", f"--python_out={gen}",
                        *PROTOS], check=True)
        subprocess.run([args.protoc_python, "-m", "grpc_tools.protoc", f"-I{args.source}",
                        f"--descriptor_set_in={descriptors}", f"--grpc_python_out={gen}",
                        *GRPC], check=True)
        for sub in ("apis", "config"):
            target = os.path.join(OUT, sub)
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)
            open(os.path.join(target, "__init__.py"), "w").close()
            folder = os.path.join(gen, "tensorflow_serving", sub)
            for name in sorted(os.listdir(folder)):
                with open(os.path.join(folder, name)) as f:
                    text = f.read()
                text = re.sub(r"^from tensorflow_serving\.", "from predict.serving_api.",
                              text, flags=re.M)
                # the module its classes name as theirs (pickle looks them up there)
                text = text.replace("DESCRIPTOR, 'tensorflow_serving.",
                                    "DESCRIPTOR, 'predict.serving_api.")
                with open(os.path.join(target, name), "w") as f:
                    f.write(text)
    shutil.copy(os.path.join(args.source, "LICENSE"), os.path.join(OUT, "LICENSE"))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
