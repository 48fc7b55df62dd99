"""`tensorflow_model_server` and `python -m predict serve`: TF Serving's flags, verbatim.

TF Serving parses its flags with TensorFlow's own flag parser: `--name=value`, and for
a boolean `--name`, `--name=true` or `--name=false`; unknown flags stop the server.
We take the same spellings (and `--name value`, and dashes for underscores), with TF
Serving's meanings and defaults (tensorflow_serving/model_servers/main.cc and
server.h's Options):

- `--port` is the gRPC port (8500); `--rest_api_port` the REST port, 0 (the default)
  leaves REST off; the two may not be equal;
- `--model_name` ("default") and `--model_base_path` serve one model;
  `--model_config_file` serves the models of a ModelServerConfig (and the two single
  model flags are ignored, as in TF Serving);
- `--model_config_file_poll_wait_seconds` (0: the file is read once),
  `--file_system_poll_wait_seconds` (1), `--max_num_load_retries` (5),
  `--load_retry_interval_micros` (60 s), `--enable_model_warmup` (true),
  `--num_request_iterations_for_warmup` (0: each warmup record once),
  `--rest_api_num_threads` (4 x CPUs), `--rest_api_timeout_in_ms` (30000),
  `--saved_model_tags` ("serve"), `--tensorflow_intra_op_parallelism` and
  `--tensorflow_inter_op_parallelism` (0: TensorFlow's choice),
  `--tensorflow_session_parallelism` (0; both pools), `--enable_batching`,
  `--batching_parameters_file`, `--monitoring_config_file`,
  `--allow_version_labels_for_unavailable_models`, `--rest_api_enable_cors_support`,
  `--enable_per_model_batching_parameters`, `--version`, `--prefer_tflite_model`
  (false), `--num_tflite_pools` and `--num_tflite_interpreters_per_pool` (1),
  `--xla_cpu_compilation_enabled` (false; taken, nothing is compiled either way).

TF Serving's Docker image runs `tensorflow_model_server --port=8500
--rest_api_port=8501 --model_name=${MODEL_NAME} --model_base_path=${MODEL_BASE_PATH}/
${MODEL_NAME} "$@"` (MODEL_NAME `model`, MODEL_BASE_PATH `/models`): when either
variable is set those are the defaults here too. Vertex AI's custom serving contract
(AIP_HTTP_PORT, AIP_STORAGE_URI) is read the same way, below the flags.

TF Serving flags we do not implement are refused in one line, never ignored. Our own
flags (`OURS`) are documented as ours.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from mljob import procs
from predict.errors import UsageError

MAX_INT32 = 2 ** 31 - 1
MAX_PORT = 65535
PORT_FLAGS = ("port", "rest_api_port", "grpc_port")  # TF Serving took 65537 as port 1


@dataclass
class Flag:
    name: str
    kind: type            # bool, int, str (float for ours only)
    default: object
    help: str
    ours: bool = False
    low: int | None = 0   # ints and floats: the least value taken


TF_SERVING = [
    Flag("port", int, 8500, "gRPC port (TF Serving's --port; 0 picks a free one)"),
    Flag("rest_api_port", int, 0, "REST port; 0 leaves REST off (TF Serving's default)"),
    Flag("rest_api_num_threads", int, 4 * procs.usable_cores(), "REST requests handled at once",
         low=1),
    Flag("rest_api_timeout_in_ms", int, 30000, "a REST request still running after this "
         "answers 504 (DEADLINE_EXCEEDED)", low=1),
    Flag("model_name", str, "default", "name of the single model (ignored with "
         "--model_config_file)"),
    Flag("model_base_path", str, "", "numbered version folders of the single model "
         "(any fsspec URL)"),
    Flag("model_config_file", str, "", "ModelServerConfig text proto (or .yaml/.json) "
         "of the models to serve"),
    Flag("model_config_file_poll_wait_seconds", float, 0, "re-read --model_config_file "
         "this often; 0 reads it once"),
    Flag("file_system_poll_wait_seconds", float, 1, "list base paths for new versions this "
         "often; 0 lists once"),
    Flag("monitoring_config_file", str, "", "MonitoringConfig text proto; with "
         "prometheus_config { enable: true } metrics are served on the REST port"),
    Flag("enable_batching", bool, False, "merge concurrent requests into one call"),
    Flag("enable_per_model_batching_parameters", bool, False, "with --enable_batching: "
         "a version batches with the batching_params.pbtxt in its folder, and without one "
         "is not batched (only num_batch_threads comes from --batching_parameters_file)"),
    Flag("rest_api_enable_cors_support", bool, False, "CORS headers on the REST API's "
         "answers (Access-Control-Allow-Origin: *, methods POST, GET, header "
         "Content-Type)"),
    Flag("batching_parameters_file", str, "", "BatchingParameters text proto"),
    Flag("enable_model_warmup", bool, True, "replay assets.extra/"
         "tf_serving_warmup_requests before a version takes traffic"),
    Flag("num_request_iterations_for_warmup", int, 0, "times each warmup record is "
         "replayed; 0: once"),
    Flag("max_num_load_retries", int, 5, "retries of a version that failed to load"),
    Flag("load_retry_interval_micros", int, 60_000_000, "wait between load retries"),
    Flag("allow_version_labels_for_unavailable_models", bool, False, "let a new label "
         "name a version that is not available yet"),
    Flag("saved_model_tags", str, "serve", "comma-separated MetaGraph tags to load"),
    Flag("tensorflow_intra_op_parallelism", int, 0, "TensorFlow intra-op threads; 0: "
         "its own choice"),
    Flag("tensorflow_inter_op_parallelism", int, 0, "TensorFlow inter-op threads; 0: "
         "its own choice"),
    Flag("tensorflow_session_parallelism", int, 0, "both pools at once, when the two "
         "above are 0"),
    Flag("version", bool, False, "print the server's and TensorFlow's versions and exit"),
    Flag("enable_grpc_healthcheck_service", bool, False, "taken: grpc.health.v1 is "
         "served on the gRPC port whatever its value"),
    Flag("xla_cpu_compilation_enabled", bool, False, "taken: this server compiles "
         "nothing with XLA either way; a model's own functions marked for XLA "
         "(jit_compile) run as TensorFlow runs them"),
    Flag("prefer_tflite_model", bool, False, "answer from the model.tflite a version "
         "folder holds beside its SavedModel (TensorFlow Lite's interpreter, "
         "pip install 'mljob[serve-tflite]'); without that file the SavedModel answers"),
    Flag("num_tflite_pools", int, 1, "with --prefer_tflite_model: pools of "
         "interpreters a version keeps", low=1),
    Flag("num_tflite_interpreters_per_pool", int, 1, "with --prefer_tflite_model: "
         "interpreters in each pool (one call at a time each)", low=1),
]

OURS = [
    Flag("model_dir", str, "", "ours: one export served as version 1, not watched",
         ours=True),
    Flag("host", str, "127.0.0.1", "ours: address both APIs listen on "
         "(tensorflow_model_server: 0.0.0.0, as TF Serving)", ours=True),
    Flag("grpc_port", int, None, "ours: the same as --port (an older spelling)",
         ours=True),
    Flag("model_version_policy", str, "latest:1", "ours: latest:N, all or specific:V1,V2 "
         "for --model_base_path (not given: every READY version of a model's record "
         "there)", ours=True),
    Flag("version_label", list, [], "ours: LABEL=VERSION for --model_base_path "
         "(repeatable)", ours=True),
    Flag("max_body_bytes", int, 1572864, "ours: largest REST body and gRPC message",
         ours=True, low=1),
    Flag("max_instances", int, 100, "ours: most instances a request", ours=True, low=1),
    Flag("threads", int, None, "ours: the same as --rest_api_num_threads", ours=True,
         low=1),
    Flag("max_batch_size", int, None, "ours: --enable_batching's max_batch_size without "
         "a parameters file", ours=True, low=1),
    Flag("batch_timeout_micros", int, None, "ours: likewise batch_timeout_micros",
         ours=True),
]

# TF Serving flags this server does not implement: refused, with why.
NOT_IMPLEMENTED = {
    "grpc_socket_path": "a UNIX socket for gRPC",
    "grpc_channel_arguments": "gRPC channel arguments",
    "grpc_max_threads": "a separate gRPC thread count (gRPC shares "
                        "--rest_api_num_threads)",
    "force_allow_any_version_labels_for_unavailable_models": "labels on any version",
    "per_process_gpu_memory_fraction": "GPU memory limits (this server runs on CPU)",
    "num_load_threads": "parallel loads (versions load one at a time)",
    "num_unload_threads": "parallel unloads",
    "flush_filesystem_caches": "flushing filesystem caches",
    "platform_config_file": "platform configs",
    "use_alts_credentials": "ALTS credentials",
    "ssl_config_file": "TLS",
    "tensorflow_session_config_file": "a session ConfigProto file",
    "enforce_session_run_timeout": "per-run timeouts",
    "remove_unused_fields_from_bundle_metagraph": "metagraph trimming",
    "thread_pool_factory_config_file": "thread pool factories",
    "enable_signature_method_name_check": "the signature method name check",
    "xla_gpu_compilation_enabled": "XLA compilation (and GPUs)",
    "enable_serialization_as_tensor_content": "a choice of the answers' tensor "
                                              "encoding",
    "enable_profiler": "the profiler service",
    "mixed_precision": "mixed precision",
    "skip_initialize_tpu": "TPUs",
    "use_tflite_model": "TF Serving's older spelling of --prefer_tflite_model",
}

_ALL = {f.name: f for f in TF_SERVING + OURS}


@dataclass
class Options:
    """The parsed flags, by TF Serving's names (ours by theirs with underscores)."""

    values: dict = field(default_factory=dict)
    given: set = field(default_factory=set)  # flags named on the command line

    def __getattr__(self, name):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None


def parse(argv, *, environ=None, drop_in: bool = False) -> Options:
    """argv (without the program name) -> Options; UsageError naming the flag on a bad
    one. `drop_in`: the `tensorflow_model_server` entry point (listens on 0.0.0.0)."""
    environ = os.environ if environ is None else environ
    values: dict = {f.name: (list(f.default) if isinstance(f.default, list) else f.default)
                    for f in _ALL.values()}
    if drop_in:
        values["host"] = "0.0.0.0"
    given: set = set()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg in ("-h", "--help", "--helpfull"):
            raise HelpRequested()
        if not arg.startswith("-") or arg in ("-", "--"):
            raise UsageError(f"unexpected argument {arg!r}; flags are --name=value")
        body = arg.lstrip("-")
        name, eq, text = body.partition("=")
        name = name.replace("-", "_")
        if name in NOT_IMPLEMENTED:
            raise UsageError(f"--{name} is a TF Serving flag this server does not implement "
                             f"({NOT_IMPLEMENTED[name]}); leave it out")
        flag = _ALL.get(name)
        if flag is None:
            raise UsageError(f"unknown flag --{name}; see --help for TF Serving's flags "
                             "this server takes")
        if flag.kind is bool:
            if not eq:
                values[name] = True
            elif text.lower() in ("true", "1"):
                values[name] = True
            elif text.lower() in ("false", "0"):
                values[name] = False
            else:
                raise UsageError(f"--{name}={text}: a boolean flag takes true or false")
            given.add(name)
            continue
        if not eq:
            if i >= len(args):
                raise UsageError(f"--{name} needs a value (--{name}=VALUE)")
            text = args[i]
            i += 1
        given.add(name)
        if flag.kind is list:
            values[name].append(text)
        elif flag.kind is int:
            values[name] = _int(name, text, flag.low)
        elif flag.kind is float:  # TF Serving's seconds are whole; fractions are ours
            values[name] = _seconds(name, text)
        else:
            values[name] = text
    if values["version"]:  # TF Serving prints its versions whatever else is given
        return Options(values, given)
    _environment(values, given, environ)
    _check(values, given)
    return Options(values, given)


def _int(name: str, text: str, low) -> int:
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise UsageError(f"--{name}={text}: not an integer") from None
    top = 2 ** 63 - 1 if name == "load_retry_interval_micros" else MAX_INT32
    if name.split()[0] in PORT_FLAGS:
        top = MAX_PORT
        if not (low or 0) <= value <= top:
            raise UsageError(f"--{name}={text}: not a port; use {low or 0}..{top}"
                             f"{' (0 picks a free one)' if not low else ''}")
    if (low is not None and value < low) or value > top:
        raise UsageError(f"--{name}={text}: must lie in {low}..{top}")
    return value


def _seconds(name: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise UsageError(f"--{name}={text}: not a number of seconds") from None
    if not 0 <= value <= MAX_INT32:  # NaN fails this too
        raise UsageError(f"--{name}={text}: must lie in 0..{MAX_INT32}")
    return value


def _environment(values: dict, given: set, environ) -> None:
    """TF Serving's image variables and Vertex AI's, as defaults below the flags."""
    if "MODEL_NAME" in environ or "MODEL_BASE_PATH" in environ:
        name = environ.get("MODEL_NAME") or "model"
        base = (environ.get("MODEL_BASE_PATH") or "/models").rstrip("/")
        if "model_name" not in given:
            values["model_name"] = name
        if "model_base_path" not in given:
            values["model_base_path"] = f"{base}/{name}"
        if "rest_api_port" not in given:
            values["rest_api_port"] = 8501
    aip_port = environ.get("AIP_HTTP_PORT")
    if aip_port:
        if "rest_api_port" not in given:
            values["rest_api_port"] = _int("rest_api_port (AIP_HTTP_PORT)", aip_port, 1)
        if "host" not in given:
            values["host"] = "0.0.0.0"  # Vertex reaches the container from outside
    uri = environ.get("AIP_STORAGE_URI")
    if uri and not ({"model_base_path", "model_config_file", "model_dir"} & given):
        values["model_base_path"] = ""
        values["model_dir"] = uri  # Vertex copies one SavedModel there


def _check(values: dict, given: set) -> None:
    if values["grpc_port"] is not None:
        if "port" in given and values["port"] != values["grpc_port"]:
            raise UsageError("--grpc_port is our older spelling of --port; give one")
        values["port"] = values["grpc_port"]
    if values["threads"] is not None:
        values["rest_api_num_threads"] = values["threads"]
    if values["rest_api_port"] and values["rest_api_port"] == values["port"]:
        raise UsageError("--rest_api_port cannot be the same as --port (gRPC); use a "
                         "different port for the REST API")
    sources = [n for n in ("model_dir", "model_base_path", "model_config_file")
               if values[n]]
    if "model_config_file" in sources:
        if "model_dir" in given:
            raise UsageError("--model_dir and --model_config_file: give one")
        # TF Serving: with a config file, --model_name and --model_base_path are ignored
        values["model_dir"] = values["model_base_path"] = ""
        if values["version_label"]:
            raise UsageError("--version_label goes with --model_base_path; a config file "
                             "labels its own versions (version_labels)")
    elif len(sources) > 1:
        if "model_dir" in given and "model_base_path" in given:
            raise UsageError("give one of --model_dir, --model_base_path, "
                             "--model_config_file")
        values["model_base_path" if "model_dir" in given else "model_dir"] = ""
    elif not sources:
        raise UsageError("nothing to serve: give --model_base_path=BASE (TF Serving's "
                         "layout BASE/<version>/), --model_config_file=FILE or "
                         "--model_dir=EXPORT")
    if values["model_dir"] and values["version_label"]:
        raise UsageError("--version_label needs --model_base_path (--model_dir serves one "
                         "version)")
    if values["model_config_file_poll_wait_seconds"] and not values["model_config_file"]:
        raise UsageError("--model_config_file_poll_wait_seconds needs --model_config_file")
    if values["batching_parameters_file"] and not values["enable_batching"]:
        raise UsageError("--batching_parameters_file needs --enable_batching")
    if values["enable_per_model_batching_parameters"] and not values["enable_batching"]:
        raise UsageError("--enable_per_model_batching_parameters needs --enable_batching")
    for name in ("num_tflite_pools", "num_tflite_interpreters_per_pool"):
        if name in given and not values["prefer_tflite_model"]:
            raise UsageError(f"--{name} needs --prefer_tflite_model")


class HelpRequested(Exception):
    pass


def help_text(prog: str) -> str:
    lines = [f"usage: {prog} --model_base_path=BASE | --model_config_file=FILE "
             "| --model_dir=EXPORT [flags]", "",
             "TF Serving's flags (their meanings and defaults):"]
    for flag in TF_SERVING:
        lines.append(f"  --{flag.name}={_shown(flag)}\n        {flag.help}")
    lines.append("\nOur own flags:")
    for flag in OURS:
        lines.append(f"  --{flag.name}={_shown(flag)}\n        {flag.help}")
    lines.append("\nEnvironment: MODEL_NAME, MODEL_BASE_PATH (TF Serving's image); "
                 "AIP_HTTP_PORT, AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE, AIP_STORAGE_URI "
                 "(Vertex AI).")
    return "\n".join(lines)


def _shown(flag: Flag) -> str:
    if flag.default is None or flag.default == []:
        return "(unset)"
    if flag.kind is bool:
        return "true" if flag.default else "false"
    return repr(flag.default) if flag.kind is str else str(flag.default)


__all__ = ["parse", "Options", "HelpRequested", "help_text", "TF_SERVING", "OURS",
           "NOT_IMPLEMENTED"]
