"""`tensorflow_model_server` / `predict serve` flags: TF Serving's names, meanings and
defaults (tensorflow_serving/model_servers/main.cc and server.h's Options), its
Docker image's environment and Vertex AI's, parsed without starting a server."""
import os

import pytest

from predict.serving import flags
from predict.errors import UsageError
from tests.test_import_circles import ROOT

BASE = ["--model_base_path=/models/m"]


def parse(*args, env=None, drop_in=False):
    return flags.parse(list(args), environ=env or {}, drop_in=drop_in)


def test_defaults_are_tf_servings():
    o = parse(*BASE)
    cpus = len(os.sched_getaffinity(0))
    assert (o.port, o.rest_api_port, o.model_name) == (8500, 0, "default")
    assert o.rest_api_num_threads == 4 * cpus and o.rest_api_timeout_in_ms == 30000
    assert o.file_system_poll_wait_seconds == 1
    assert o.model_config_file_poll_wait_seconds == 0
    assert o.max_num_load_retries == 5 and o.load_retry_interval_micros == 60_000_000
    assert o.enable_model_warmup is True and o.num_request_iterations_for_warmup == 0
    assert o.enable_batching is False and o.allow_version_labels_for_unavailable_models is False
    assert o.saved_model_tags == "serve" and o.monitoring_config_file == ""
    assert o.tensorflow_intra_op_parallelism == 0 == o.tensorflow_inter_op_parallelism
    assert o.host == "127.0.0.1" and parse(*BASE, drop_in=True).host == "0.0.0.0"


def test_port_is_grpc_and_rest_is_its_own_flag():
    o = parse("--port=9000", "--rest_api_port=9001", *BASE)
    assert (o.port, o.rest_api_port) == (9000, 9001)
    o = parse("--port", "9000", "--rest-api-port", "9001", *BASE)  # ours: spaces, dashes
    assert (o.port, o.rest_api_port) == (9000, 9001)
    assert parse("--grpc-port=7000", *BASE).port == 7000  # our older spelling
    with pytest.raises(UsageError, match="--rest_api_port cannot be the same as --port"):
        parse("--port=8500", "--rest_api_port=8500", *BASE)


def test_booleans_take_tf_servings_forms():
    assert parse("--enable_batching", *BASE).enable_batching is True
    assert parse("--enable_batching=true", *BASE).enable_batching is True
    assert parse("--enable_batching=false", *BASE).enable_batching is False
    assert parse("--enable_model_warmup=false", *BASE).enable_model_warmup is False
    with pytest.raises(UsageError, match="a boolean flag takes true or false"):
        parse("--enable_batching=yes", *BASE)


@pytest.mark.parametrize("args, words", [
    (["--no_such_flag=1"], "unknown flag --no_such_flag"),
    (["--grpc_channel_arguments=a=1"], "--grpc_channel_arguments is a TF Serving flag this "
                                       "server does not implement"),
    (["--ssl_config_file=x"], "does not implement (TLS)"),
    (["--grpc_socket_path=/tmp/s"], "does not implement (a UNIX socket for gRPC)"),
    (["--enable_cors_support"], "unknown flag --enable_cors_support"),  # not TF Serving's
    (["--xla_gpu_compilation_enabled"], "does not implement (XLA compilation (and GPUs))"),
    (["--enable_per_model_batching_parameters"], "needs --enable_batching"),
    (["--port=abc"], "--port=abc: not an integer"),
    (["--port=-1"], "--port=-1: not a port; use 0..65535 (0 picks a free one)"),
    (["--port=65536"], "--port=65536: not a port; use 0..65535"),
    (["--port=65537"], "--port=65537: not a port; use 0..65535"),  # was port 1
    (["--port=99999"], "--port=99999: not a port; use 0..65535"),  # was port 34463
    (["--rest_api_port=65536"], "--rest_api_port=65536: not a port; use 0..65535"),
    (["--grpc_port=70000"], "--grpc_port=70000: not a port; use 0..65535"),
    (["--rest_api_num_threads=0"], "must lie in 1.."),
    (["--file_system_poll_wait_seconds=nan"], "must lie in 0.."),
    (["--model_config_file_poll_wait_seconds=5"], "needs --model_config_file"),
    (["--batching_parameters_file=b.txt"], "needs --enable_batching"),
    (["--model_name"], "--model_name needs a value"),
    (["--xla_cpu_compilation_enabled=maybe"], "--xla_cpu_compilation_enabled=maybe: a "
                                              "boolean flag takes true or false"),
    (["--prefer_tflite_model=yes"], "--prefer_tflite_model=yes: a boolean flag takes "
                                    "true or false"),
    (["--num_tflite_pools=2"], "--num_tflite_pools needs --prefer_tflite_model"),
    (["--compile_small_calls=false"], "unknown flag --compile_small_calls"),
    (["--grpc_native_front=false"], "unknown flag --grpc_native_front"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_bad_flags_are_refused_in_one_line(args, words):
    with pytest.raises(UsageError) as raised:
        parse(*BASE, *args)
    assert words in str(raised.value) and "\n" not in str(raised.value)


def test_nothing_to_serve_names_the_flags():
    with pytest.raises(UsageError, match="nothing to serve: give --model_base_path"):
        parse("--port=8500")


def test_config_file_wins_over_the_single_model_flags_as_in_tf_serving():
    o = parse("--model_config_file=/c.config", "--model_name=x", "--model_base_path=/b")
    assert o.model_config_file == "/c.config" and o.model_base_path == ""


def test_the_images_environment_and_flags_over_it():
    env = {"MODEL_NAME": "half_plus_two"}
    o = parse(env=env)
    assert (o.model_name, o.model_base_path) == ("half_plus_two", "/models/half_plus_two")
    assert (o.port, o.rest_api_port) == (8500, 8501)
    o = parse(env={"MODEL_NAME": "m", "MODEL_BASE_PATH": "gs://b/models/"})
    assert o.model_base_path == "gs://b/models/m"
    o = parse("--model_base_path=/elsewhere", "--rest_api_port=0", env=env)
    assert (o.model_name, o.model_base_path, o.rest_api_port) == (
        "half_plus_two", "/elsewhere", 0)


def test_vertex_ais_variables():
    env = {"AIP_HTTP_PORT": "8080", "AIP_STORAGE_URI": "gs://bucket/model"}
    o = parse(env=env)
    assert (o.rest_api_port, o.host, o.model_dir) == (8080, "0.0.0.0", "gs://bucket/model")
    o = parse("--model_base_path=/b", env=env)  # flags name the model: AIP_STORAGE_URI unused
    assert (o.model_base_path, o.model_dir) == ("/b", "")
    with pytest.raises(UsageError, match="AIP_HTTP_PORT"):
        parse(env={"AIP_HTTP_PORT": "http", "AIP_STORAGE_URI": "/m"})
    for bad in ("99999", "65536", "0", "-1"):  # 99999 was a traceback
        with pytest.raises(UsageError, match=r"--rest_api_port \(AIP_HTTP_PORT\)="
                                             f"{bad}: not a port; use 1..65535"):
            parse(env={"AIP_HTTP_PORT": bad, "AIP_STORAGE_URI": "/m"})


def test_help_lists_every_flag_and_says_which_are_ours():
    text = flags.help_text("tensorflow_model_server")
    for flag in flags.TF_SERVING + flags.OURS:
        assert f"--{flag.name}=" in text
    assert "--port=8500" in text and "--rest_api_port=0" in text
    assert all(f.help.startswith("ours:") for f in flags.OURS)
    with pytest.raises(flags.HelpRequested):
        parse("--help")


def test_cors_per_model_batching_and_version_are_taken_by_tf_servings_names():
    o = parse("--rest_api_enable_cors_support=true", "--enable_batching",
              "--enable_per_model_batching_parameters", *BASE)
    assert o.rest_api_enable_cors_support is True
    assert o.enable_per_model_batching_parameters is True
    assert parse(*BASE).rest_api_enable_cors_support is False
    assert parse("--enable_grpc_healthcheck_service=true", *BASE)  # always served here
    # --version needs nothing to serve, as TF Serving prints it before any check
    assert parse("--version").version is True


def test_version_prints_tf_servings_two_lines_and_exits_0(capsys):
    from predict.serving import process as serving
    assert serving.main(["--version"], prog="tensorflow_model_server") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("TensorFlow ModelServer: ") and "+mljob." in out[0]
    assert out[1].startswith("TensorFlow Library: 2.")


def test_with_a_grpcio_older_than_the_stubs_the_server_says_so_before_loading_anything(
        monkeypatch, capsys, tmp_path):
    """The default command line needs TF Serving's protos (the gRPC API, vendored in
    predict.serving_api): with a grpcio older than the one they were generated for it
    fails at once, in one line naming what to install, before any model loads (the
    model dir here does not even exist)."""
    import sys

    import grpc

    from predict.serving import process as serving
    from predict.serving_api.apis import predict_pb2  # noqa: F401  (TensorFlow's protos: its import)
    monkeypatch.setattr(grpc, "__version__", "1.60.0")
    # imported afresh (an earlier test may have imported it): from sys.modules and from
    # its package, which `from ... import` reads first
    from predict.serving_api import apis
    monkeypatch.delitem(sys.modules, "predict.serving_api.apis.prediction_service_pb2_grpc",
                        raising=False)
    monkeypatch.delattr(apis, "prediction_service_pb2_grpc", raising=False)
    status = serving.main([f"--model_base_path={tmp_path}/none", "--rest_api_port=0",
                           "--port=0"], prog="tensorflow_model_server")
    err = capsys.readouterr().err.strip()
    # status 1 and the stubs' reason, not 2 and the missing base path: refused before
    # any model was looked for (no timing: a loaded machine takes its time)
    assert status == 1, err
    assert err.count("\n") == 0, err
    assert "grpcio>=1.75.1" in err and "pip install 'mljob[serve]'" in err
    assert "at version 1.60.0" in err  # the stubs' own check said why


REFUSE_WITHOUT_TENSORFLOW = """
import socket, sys
from predict.serving import process as serving
busy = socket.socket()
busy.bind(("127.0.0.1", 0))
busy.listen()
port = busy.getsockname()[1]
argv = [a.replace("BUSY", str(port)) for a in sys.argv[1:]]
status = serving.main(argv, prog="tensorflow_model_server")
print("tensorflow" in sys.modules, status)
"""


@pytest.mark.parametrize("args, words", [
    (["--version"], None),
    (["--model_dir=EXPORT", "--rest_api_port=BUSY", "--port=0"],
     "cannot listen on 127.0.0.1:"),
    (["--model_dir=EXPORT", "--port=BUSY"], "for gRPC (Address already in use)"),
    (["--model_base_path=EXPORT", "--model_version_policy=newest:2", "--port=0"],
     "version policy 'newest:2'"),
    (["--model_config_file=/dev/zero", "--port=0"], "cannot read /dev/zero"),
    (["--model_dir=EXPORT", "--port=0", "--monitoring_config_file=MISSING"],
     "--monitoring_config_file"),
    (["--model_dir=EXPORT", "--port=0", "--enable_batching",
      "--batching_parameters_file=FIFO"], "--batching_parameters_file"),
], ids=["version", "REST port in use", "gRPC port in use", "bad version policy",
        "a device as config file", "a missing monitoring file", "a FIFO as batching file"])
def test_refusals_come_before_tensorflow_is_imported(args, words, tmp_path):
    """--version and every refusal of the flags and the files they name answer before
    TensorFlow is imported (it takes seconds, 12 on a loaded machine): the process
    that refused has no tensorflow module."""
    import subprocess
    import sys
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    argv = [a.replace("EXPORT", str(tmp_path)).replace("MISSING", str(tmp_path / "none"))
            .replace("FIFO", str(fifo)) for a in args]
    done = subprocess.run([sys.executable, "-c", REFUSE_WITHOUT_TENSORFLOW, *argv],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert done.stdout.split()[-2:] == ["False", "0" if words is None else "2"], done
    if words is not None:
        assert words in done.stderr and done.stderr.count("\n") == 1, done.stderr


LOG_TWICE = """
import logging
from predict.serving import process
process._logging()
logging.getLogger("predict.serving").info("model m: version 1 available")
logging.basicConfig()  # what a library does on its first use (Keras, absl)
logging.getLogger("predict.serving").info("model m: version 2 available")
"""


def test_a_log_line_is_written_once_when_a_library_configures_logging_after():
    """Converting or exporting a model runs `logging.basicConfig`: the server's lines
    must still come once each, not once per handler (in a process of its own, whose
    root logger starts bare as the server's does)."""
    import subprocess
    import sys
    done = subprocess.run([sys.executable, "-c", LOG_TWICE], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("version 1 available") == 1, done.stderr
    assert done.stderr.count("version 2 available") == 1, done.stderr
