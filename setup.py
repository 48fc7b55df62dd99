"""One distribution, four packages: the shared core, the bundled trainer, the job launcher
and the predictor.

This is the file `python -m submit` builds into the sdist that every job stages.
"""
from setuptools import find_packages, setup

UVICORN = "uvicorn>=0.30"  # the console and the model server's REST port, public API only
# mljob.training reads Keras's private names (mljob/training/keras_private.py, every one
# in that module): the range is the one tested; tests/mljob/test_keras_private.py fails
# naming the name a release moves
KERAS = "keras>=3.15,<3.16"

setup(
    name="mljob",
    version="0.1.0",
    description="Run distributed TensorFlow training jobs the way Cloud ML Engine did, "
    "locally or on a cluster.",
    packages=find_packages(include=["mljob", "mljob.*", "trainer", "trainer.*", "submit", "submit.*",
                                    "predict", "predict.*"]),
    package_data={"trainer": ["sample/*.gz", "sample/README.md"],
                  "predict.serving_api": ["LICENSE"]},
    python_requires=">=3.10",
    # What every use needs, and all a replica needs beside TensorFlow (which the `cpu`
    # extra or the image gives): mljob's core. Each use adds its extra (docs/install.md
    # measures them): `submit` the command line, runners and console; `serve` the model
    # server and batch prediction's workers.
    install_requires=[
        "fsspec>=2024.2",
        "gcsfs>=2024.2",
        "psutil>=5.9",
        "tenacity>=8.2",  # storage retries: exponential back-off with jitter
    ],
    extras_require={
        # `python -m submit`: the launcher, its local runner and the console
        "submit": [
            "click>=8.1",
            "PyYAML>=6",
            "pydantic>=2.5",   # config.yaml's schema (submit/jobdef/config_schema.py)
            "setuptools>=61",  # the build backend of setup.py projects (and the generated one)
            "build>=1.2",      # the launcher builds sdists with `python -m build --sdist`
            "starlette>=0.37", UVICORN,  # the console
            # `--filter`'s ~ patterns (jobs list, the console, list_jobs): RE2 matches in
            # time linear in the text, so no pattern can hold a command or the console
            "google-re2>=1.1",
        ],
        # `python -m predict` and `tensorflow_model_server`: the server, local and batch
        # prediction (whose workers `jobs submit prediction` starts). TF Serving's API
        # protos are vendored (predict.serving_api, generated from its 2.20.0 release):
        # they need the grpcio and protobuf they were generated for, and TensorFlow's
        # own protos from the TensorFlow the server loads models with
        "serve": [
            "click>=8.1",
            "PyYAML>=6",
            UVICORN,
            "google-crc32c>=1.5",    # TFRecord checksums
            # uvicorn's own choice of HTTP parser and event loop when installed (its
            # `standard` extra's two, without the reloader's); orjson for JSON bodies
            "httptools>=0.6",
            "uvloop>=0.19; sys_platform != 'win32'",
            "orjson>=3.8",
            "prometheus-client>=0.17",  # /monitoring/prometheus/metrics
            "grpcio>=1.75.1",           # the gRPC API (--port), grpcio's own server
            "grpcio-health-checking>=1.60",  # grpc.health.v1 on the gRPC port
            "protobuf>=6.31.1",         # the vendored protos' runtime (protoc 31.1)
        ],
        # --prefer_tflite_model: a version's model.tflite answered by TensorFlow Lite's
        # interpreter (Google's LiteRT; TensorFlow's own tf.lite.Interpreter is
        # deprecated). Never imported by the server without the flag.
        "serve-tflite": ["ai-edge-litert>=2.3,<3"],
        # TensorFlow is an extra: on this machine `cpu` installs it; on a cluster the
        # image provides it (Kubeflow's TensorFlow base, Vertex's prebuilt executors),
        # and a hard requirement would make pip lay a second TensorFlow over the image's.
        "cpu": ["tensorflow-cpu==2.21.*", KERAS],
        "gpu": ["tensorflow[and-cuda]==2.21.*", KERAS],
        # the cluster engines' SDKs (`--runner kubeflow`, `--runner vertex`)
        "kubeflow": ["kubernetes>=29"],
        "vertex": ["google-cloud-aiplatform>=1.60"],
        # `--runner ray`: Ray's `default` extra is the smallest install with the
        # dashboard's job API (submit, status, logs, stop), `ray start --head` serving it,
        # and pip runtime_envs (virtualenv)
        "ray": ["ray[default]==2.60.0"],
        # hyperparameter tuning on the local runner: the study, its plot, and TensorBoard's
        # HParams summaries (written with tensorboard's protos, no TensorFlow)
        "tuning": ["optuna>=4.0", "matplotlib>=3.8", "tensorboard>=2.12"],
        "test": [
            "pytest>=8",
            "uv>=0.5",  # package environments built with uv (pip where it is absent)
            "pytest-timeout>=2.3",
            # the default run on both cores, a test file per worker (tests/conftest.py)
            "pytest-xdist>=3.5",
            "hypothesis>=6.100",
            "httpx>=0.27",
            "gcp-storage-emulator>=2024.8",
            "tensorboard==2.21.*",
            "kubernetes>=29",
            "kubeflow-training>=1.8,<2",
            "google-cloud-aiplatform>=1.60",
            "optuna>=4.0",
            "cloudml-hypertune>=0.1.0.dev6",  # a trainer that reports with Google's library
            "kubeflow-katib-api>=0.17",       # Katib's Experiment models check our render
            # the engines' CRD schemas check every manifest we render, and the published
            # config.yaml schema is checked against its models
            "jsonschema>=4.18",
            "playwright>=1.45",  # the console's browser tests, driving Debian's chromium
            # the Python API's notebook (docs/notebook.ipynb), executed headless in the
            # slow tests by Jupyter's own executor on a real kernel
            "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29",
            "tqdm>=4.66", "ipywidgets>=8.1",  # its progress bar (the notebook extra)
            # `.ci/run`'s linters, pinned: a newer release may find new things to say
            "ruff==0.17.*",
            "mypy==2.4.*",
        ],
        "bench": ["matplotlib>=3.8", "uv>=0.5"],
        # the Python API's progress bar in a notebook (submit/api/progress.py; lines on
        # stderr without them)
        "notebook": ["tqdm>=4.66", "ipywidgets>=8.1", "ipython>=8"],
    },
    entry_points={
        "console_scripts": [
            "mljob-submit=submit.__main__:main",
            "mljob-predict=predict.__main__:main",
            # TF Serving's binary name and flags (predict.flags), for its command lines
            "tensorflow_model_server=predict.serving:main_model_server",
        ],
    },
)
