"""predict.grpc_front: the gRPC port's pool runs a fast unary serving call on the
dispatching thread when nothing else runs, and everything else on its pool threads;
with pygrpc-native's real server and grpcio's real client over 127.0.0.1."""
import threading
import time

import grpc
import pytest

from predict import grpc_front
from predict.server import INLINE_S

pygrpc_native = pytest.importorskip("pygrpc_native")

PREDICT = "/tensorflow.serving.PredictionService/Predict"


def _identity(raw: bytes) -> bytes:
    return raw


@pytest.fixture
def front():
    """A pygrpc-native server on grpc_front's pool, whose Predict and
    HandleReloadConfigRequest answer the name of the thread that ran them after the
    seconds the request asks (b'0.01'; a reload ends sooner once released); yields
    ((an Event set once a reload runs, the Event that releases it), a way to call a
    method)."""
    def predict(request, context):
        time.sleep(float(request.decode() or 0))
        return threading.current_thread().name.encode()

    reloading, release = threading.Event(), threading.Event()

    def reload(request, context):
        reloading.set()
        release.wait(float(request.decode() or 0))
        return threading.current_thread().name.encode()

    server = grpc_front.server(2, [], native=True, batching=False)
    for service, name, fn in (("tensorflow.serving.PredictionService", "Predict", predict),
                              ("tensorflow.serving.ModelService",
                               "HandleReloadConfigRequest", reload)):
        server.add_registered_method_handlers(service, {name: grpc.unary_unary_rpc_method_handler(
            fn, request_deserializer=_identity, response_serializer=_identity)})
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = lambda method: channel.unary_unary(  # noqa: E731
        method, request_serializer=_identity, response_deserializer=_identity)
    try:
        yield (reloading, release), call
    finally:
        release.set()  # a test that failed holding a reload
        channel.close()
        server.stop(None).wait(10)


DISPATCH = "pygrpc-native-dispatch"


def _until_dispatched(predict) -> None:
    """Call until a call runs on the dispatching thread: a pool thread has answered the
    call before it has counted that call done, so the next may still see it in flight."""
    for _ in range(50):
        if predict(b"", timeout=30).decode() == DISPATCH:
            return
        time.sleep(0.02)
    raise AssertionError("no call ran on the dispatching thread")


def test_a_fast_call_alone_runs_on_the_dispatching_thread(front):
    _, call = front
    predict = call(PREDICT)
    first = predict(b"", timeout=30).decode()
    assert first.startswith("grpc")  # its time is not known yet: the pool
    _until_dispatched(predict)
    assert {predict(b"", timeout=30).decode() for _ in range(5)} == {DISPATCH}
    # a method outside the serving API (a config reload may take minutes) never does
    reload = call("/tensorflow.serving.ModelService/HandleReloadConfigRequest")
    names = []
    for _ in range(6):
        names.append(reload(b"", timeout=30).decode())
        time.sleep(0.02)
    assert all(name.startswith("grpc") for name in names)


def test_a_slow_call_or_a_call_beside_another_goes_to_the_pool(front):
    (reloading, release), call = front
    predict = call(PREDICT)
    slow = f"{INLINE_S * 5}".encode()
    predict(slow, timeout=30)
    assert predict(b"", timeout=30).decode().startswith("grpc")  # the last was slow
    _until_dispatched(predict)
    # while another call runs (a reload, on the pool), a fast call is the pool's too
    reload = call("/tensorflow.serving.ModelService/HandleReloadConfigRequest")
    done = []
    long = threading.Thread(target=lambda: done.append(reload(b"30", timeout=60)))
    long.start()
    assert reloading.wait(30)
    beside = predict(b"", timeout=30).decode()
    release.set()
    long.join()
    assert beside.startswith("grpc") and done[0].decode().startswith("grpc")
    _until_dispatched(predict)  # alone again


def test_with_batching_every_call_goes_to_the_pool():
    """A batched call waits for its batch: on the dispatching thread, no other call
    could reach the queue meanwhile."""
    pool = grpc_front.Calls(2, inline=False)

    class Call:
        method, streaming = PREDICT, False

    try:
        names = [pool.submit(lambda *a: threading.current_thread().name, None, Call(),
                             b"").result() for _ in range(4)]
    finally:
        pool.shutdown()
    assert all(n.startswith("grpc") for n in names)


def test_a_streaming_call_never_runs_here_nor_holds_the_fast_path():
    """A health watch stays open for the connection's life: it goes to the pool and
    does not count as work in flight."""
    pool = grpc_front.Calls(2, inline=True)
    release = threading.Event()

    class Watch:
        method, streaming = "/grpc.health.v1.Health/Watch", True

    class Check:
        method, streaming = "/grpc.health.v1.Health/Check", False

    try:
        watching = pool.submit(lambda *a: (release.wait(30),
                                           threading.current_thread().name)[1],
                               None, Watch(), b"")
        here = threading.current_thread().name
        names = [pool.submit(lambda *a: threading.current_thread().name, None, Check(),
                             b"").result() for _ in range(3)]
        assert names[0] != here and names[1:] == [here, here]
    finally:
        release.set()
        assert watching.result(30).startswith("grpc")
        pool.shutdown()
