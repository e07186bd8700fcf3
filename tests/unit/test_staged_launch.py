"""The compiled call path (``engine/fused/cpp/staged_launch.cpp``), built here with the
machine's C++ compiler against CPU torch.

There is no CUDA driver on CI machines, so the driver functions it is given are Python
callbacks that record each call and can fail on demand; the real driver is exercised by
the GPU suite (``tests/gpu/test_fused_gpu.py``: the staged calls on both paths). CPU
tensors report device -1, which the object is built for here.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from engine.fused import staged_launch  # noqa: E402
from engine.fused.graphs import staged_tensors_fit  # noqa: E402

_CXX = os.environ.get("CXX", "c++").split()[0]
pytestmark = pytest.mark.skipif(shutil.which(_CXX) is None, reason=f"no C++ compiler ({_CXX})")

_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
_CTX_GET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
_CTX_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)

EXEC, CONTEXT, STAGE_NODE, OUTPUT_NODE = 0x1000, 0x2000, 0x3000, 0x4000
STAGE_OFFSETS = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 4), (36, 4)]  # kernels.STAGE_ARGS
OUTPUT_OFFSETS = [(0, 8), (16, 8)]  # one address for two arguments (graph_args.pointer_arg)


class Driver:
    """The four driver functions as recording callbacks over two parameter buffers."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.current = 0  # the thread's current context (0: none)
        self.fail: dict[str, int] = {}  # function -> CUresult to return
        self.stage_buffer = ctypes.create_string_buffer(40)
        self.output_buffer = ctypes.create_string_buffer(24)
        self.stage_params = ctypes.create_string_buffer(8)  # stand-ins: only their address
        self.output_params = ctypes.create_string_buffer(8)

        def set_params(exec_: int, node: int, params: int) -> int:
            buffer = self.stage_buffer if node == STAGE_NODE else self.output_buffer
            self.calls.append(("set", exec_, node, params, buffer.raw))
            if node == OUTPUT_NODE and "set_output" in self.fail:
                return self.fail["set_output"]
            return self.fail.get("set", 0)

        def launch(exec_: int, stream: int | None) -> int:
            self.calls.append(("launch", exec_, stream or 0))
            return self.fail.get("launch", 0)

        def ctx_get(out: Any) -> int:
            out[0] = self.current or None
            return self.fail.get("ctx_get", 0)

        def ctx_set(context: int | None) -> int:
            self.calls.append(("ctx", context or 0))
            if (context or 0) != CONTEXT and "restore" in self.fail:
                return self.fail["restore"]
            self.current = context or 0
            return self.fail.get("ctx_set", 0) if context == CONTEXT else 0

        self._callbacks = (_SET(set_params), _LAUNCH(launch), _CTX_GET(ctx_get),
                           _CTX_SET(ctx_set))

    def fields(self, **over: Any) -> dict[str, Any]:
        stage = ctypes.addressof(self.stage_buffer)
        output = ctypes.addressof(self.output_buffer)
        addresses = [ctypes.cast(f, ctypes.c_void_p).value for f in self._callbacks]
        fields = dict(
            owners=(self.stage_buffer, self.output_buffer), exec=EXEC, context=CONTEXT,
            device=-1, set_params=addresses[0], graph_launch=addresses[1],
            ctx_get=addresses[2], ctx_set=addresses[3], stage_node=STAGE_NODE,
            stage_params=ctypes.addressof(self.stage_params),
            stage_slots=[(stage + o, n) for o, n in STAGE_OFFSETS], output_node=OUTPUT_NODE,
            output_params=ctypes.addressof(self.output_params),
            output_slots=[(output + o, n) for o, n in OUTPUT_OFFSETS])
        return fields | over

    def stage_values(self) -> tuple[int, ...]:
        raw = self.stage_buffer.raw
        return tuple(int.from_bytes(raw[o:o + n], "little", signed=n == 4)
                     for o, n in STAGE_OFFSETS)

    def output_values(self) -> tuple[int, ...]:
        raw = self.output_buffer.raw
        return tuple(int.from_bytes(raw[o:o + n], "little") for o, n in OUTPUT_OFFSETS)

    def kinds(self) -> list[tuple[Any, ...]]:
        return [(c[0], c[2]) if c[0] == "set" else c for c in self.calls]


@pytest.fixture(scope="module")
def module() -> Any:
    return staged_launch.load()


@pytest.fixture()
def driver() -> Driver:
    return Driver()


def _batch(tokens: int = 8) -> list[Any]:
    return [torch.arange(tokens, dtype=torch.int32) for _ in range(3)] + [
        torch.tensor([0, tokens - 3, tokens], dtype=torch.int32)]


def test_a_launch_names_the_tensors_then_launches(module: Any, driver: Driver) -> None:
    staged = module.StagedLaunch(**driver.fields())
    batch, out = _batch(), torch.zeros(2, 16)
    assert staged.launch(*batch, out, 16, 4, 0x77) == 0
    # The graph's context made current for the driver calls, and left as it was (none).
    assert driver.kinds() == [("ctx", CONTEXT), ("set", STAGE_NODE), ("set", OUTPUT_NODE),
                              ("launch", EXEC, 0x77), ("ctx", 0)]
    assert driver.calls[1][3] == ctypes.addressof(driver.stage_params)
    assert driver.stage_values() == (*(t.data_ptr() for t in batch), 8, 2)
    assert driver.output_values() == (out.data_ptr(),) * 2
    assert staged.named == ((*(t.data_ptr() for t in batch), 8, 2), out.data_ptr())
    # The same tensors again, in the graph's context already: the launch alone.
    driver.calls.clear()
    driver.current = CONTEXT
    assert staged.launch(*batch, out, 16, 4, 0x77) == 0
    assert driver.kinds() == [("launch", EXEC, 0x77)]
    # New inputs, same output: only the first kernel's arguments are set.
    driver.calls.clear()
    other = _batch()
    assert staged.launch(other[0], *batch[1:], out, 16, 4, 0) == 0
    assert driver.kinds() == [("set", STAGE_NODE), ("launch", EXEC, 0)]
    assert driver.stage_values()[0] == other[0].data_ptr()


def test_it_writes_what_kernel_args_write(module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Over real ``KernelArgs``/``PointerArg`` buffers (``native_view``), the compiled
    ``name`` hands the driver the same argument bytes as the Python ``set``s, captured
    arguments around them kept."""
    from engine.fused.graph_args import KernelArgs, PointerArg, _NodeParams
    from tests.unit.test_graph_args import LAYOUT, _args

    values, out = (0x7F00_1122_3344, 0x7F00_5566_7788, 0x10, 0x20, 128, 3), 0x7F00_99AA_BB00

    def python_bytes() -> list[list[bytes]]:
        sent: list[list[bytes]] = []
        stage = _args(monkeypatch, KernelArgs, [0, 1, 2, 3, 4, 5], "QQQQii", sent)
        output = _args(monkeypatch, PointerArg, [7, 9], "QQ", sent)
        stage.set(*values)
        output.set(out)
        return sent

    sent: list[list[bytes]] = []
    stage = _args(monkeypatch, KernelArgs, [0, 1, 2, 3, 4, 5], "QQQQii", [])
    output = _args(monkeypatch, PointerArg, [7, 9], "QQ", [])

    def set_params(_exec: int, _node: int, params: int) -> int:
        p = _NodeParams.from_address(params)
        sent.append([ctypes.string_at(p.kernel_params[i], size) for i, (_, size) in
                     enumerate(LAYOUT)])
        return 0

    driver = Driver()
    callback = _SET(set_params)
    stage_node, stage_params, stage_slots = stage.native_view()
    output_node, output_params, output_slots = output.native_view()
    staged = module.StagedLaunch(**driver.fields(
        owners=(stage, output), set_params=ctypes.cast(callback, ctypes.c_void_p).value,
        stage_node=stage_node, stage_params=stage_params, stage_slots=stage_slots,
        output_node=output_node, output_params=output_params, output_slots=output_slots))
    assert staged.name(*values, out) == 0
    assert sent == python_bytes() and len(sent) == 2


def test_refusals_match_the_python_check(module: Any, driver: Driver) -> None:
    """Every batch ``staged_tensors_fit`` refuses is refused (TENSORS_MISFIT) before any
    driver call, and the ones it accepts are launched."""
    staged = module.StagedLaunch(**driver.fields())
    out = torch.zeros(2, 16)
    cases: list[list[Any]] = [_batch()]
    for i in range(4):
        for change in (lambda t: t.long(), lambda t: t.float(),
                       lambda t: torch.zeros(2 * t.shape[0], dtype=torch.int32)[::2],
                       lambda t: t.reshape(1, -1), lambda t: t[:0]):
            case = _batch()
            case[i] = change(case[i])
            cases.append(case)
    for i in range(3):
        short = _batch()
        short[i] = short[i][:7]
        cases.append(short)
    for case in cases:
        driver.calls.clear()
        fits = staged_tensors_fit(*case, -1)
        result = staged.launch(*case, out, 16, 16, 0)
        assert result == (0 if fits else staged_launch.TENSORS_MISFIT), case
        assert bool(driver.calls) == fits
    driver.calls.clear()
    assert staged.launch(_batch()[0].tolist(), *_batch()[1:], out, 16, 4, 0) == \
        staged_launch.TENSORS_MISFIT  # not a tensor
    assert not staged_tensors_fit(*_batch(), 0)  # another device, both ways
    assert module.StagedLaunch(**driver.fields(device=0)).launch(*_batch(), out, 16, 4, 0) \
        == staged_launch.TENSORS_MISFIT
    assert driver.calls == []


def test_a_batch_larger_than_the_bucket_is_refused(module: Any, driver: Driver) -> None:
    staged = module.StagedLaunch(**driver.fields())
    out = torch.zeros(2, 16)
    assert staged.launch(*_batch(8), out, 7, 4, 0) == staged_launch.NOT_IN_BUCKET
    assert staged.launch(*_batch(8), out, 8, 1, 0) == staged_launch.NOT_IN_BUCKET  # 2 seqs
    assert driver.calls == []
    assert staged.launch(*_batch(8), out, 8, 2, 0) == 0


def test_a_failed_set_is_redone_and_the_context_restored(module: Any,
                                                         driver: Driver) -> None:
    staged = module.StagedLaunch(**driver.fields())
    batch, out = _batch(), torch.zeros(2, 16)
    driver.current = 0x9000  # another context current in this thread
    driver.fail["set"] = 700
    assert staged.launch(*batch, out, 16, 4, 0) == 700
    assert staged.failed == "cuGraphExecKernelNodeSetParams"
    assert driver.kinds() == [("ctx", CONTEXT), ("set", STAGE_NODE), ("ctx", 0x9000)]
    assert staged.named is None
    del driver.fail["set"]
    driver.calls.clear()
    assert staged.launch(*batch, out, 16, 4, 0) == 0  # set again: the driver took nothing
    assert [k for k in driver.kinds() if k[0] == "set"] == [("set", STAGE_NODE),
                                                             ("set", OUTPUT_NODE)]
    driver.fail["launch"] = 719
    assert staged.launch(*batch, out, 16, 4, 0) == 719
    assert staged.failed == "cuGraphLaunch"
    assert driver.current == 0x9000
    driver.fail = {"ctx_get": 201}
    driver.calls.clear()
    assert staged.launch(*batch, out, 16, 4, 0) == 201
    assert staged.failed == "cuCtxGetCurrent" and driver.calls == []
    driver.fail = {"ctx_set": 201}  # the graph's context cannot be made current
    assert staged.launch(*batch, out, 16, 4, 0) == 201
    assert staged.failed == "cuCtxSetCurrent"
    assert not [c for c in driver.calls if c[0] == "launch"]
    driver.fail = {"restore": 202}  # launched, but the caller's context not restored
    driver.current = 0x9000
    assert staged.launch(*batch, out, 16, 4, 0) == 202
    assert staged.failed == "cuCtxSetCurrent"
    driver.fail = {"launch": 719, "restore": 202}  # both: the first is the result
    driver.current = 0x9000
    assert staged.launch(*batch, out, 16, 4, 0) == 719
    assert staged.failed == ("cuGraphLaunch (and cuCtxSetCurrent, restoring the caller's "
                             "context)")


STREAM = 0x77


def _with_call(module: Any, driver: Driver, make: Any = None) -> Any:
    """A StagedLaunch with ``call``'s fields: a 16-token, 4-sequence bucket on STREAM."""
    return module.StagedLaunch(**driver.fields(
        max_tokens=16, max_seqs=4, current_stream=lambda device: STREAM,
        make_output=make or (lambda: torch.zeros(2, 16)), out_of_memory=torch.OutOfMemoryError))


def test_name_and_rearm(module: Any, driver: Driver) -> None:
    """``name`` (``_CallArgs.name``: the host path's buffers) sets what changed;
    ``rearm`` (after a checked launch: the next call's output) makes that output, keeps it
    as the spare of the stream and names it, keeping the inputs last named."""
    staged = _with_call(module, driver)
    values = (11, 22, 33, 44, 128, 1)
    assert staged.name(*values, 55) == 0
    assert driver.stage_values() == values and driver.output_values() == (55, 55)
    driver.calls.clear()
    assert staged.name(*values, 55) == 0
    assert driver.kinds() == [("ctx", CONTEXT), ("ctx", 0)]  # no set
    driver.calls.clear()
    assert staged.rearm(STREAM) is None
    out = staged.spare
    assert out is not None and staged.spare_stream == STREAM
    assert [k for k in driver.kinds() if k[0] == "set"] == [("set", OUTPUT_NODE)]
    assert staged.named == (values, out.data_ptr())
    with pytest.raises(TypeError):
        staged.name(*values)
    with pytest.raises(TypeError):
        staged.rearm("55")
    with pytest.raises(RuntimeError, match="call"):
        module.StagedLaunch(**driver.fields()).rearm(STREAM)


def test_call_launches_on_the_spare_and_names_the_next(module: Any, driver: Driver) -> None:
    """``call`` (the engine's known batch sizes): on the stream the cache's last call
    used, it launches on the spare output (named already: no set for it), then makes
    the next output and names it for the next launch; it returns the logits, a view
    of the first T columns where T is under the bucket's tokens."""
    staged = _with_call(module, driver)
    batch = _batch()
    assert staged.spare is None
    assert staged.call(*batch, STREAM) is None  # no spare yet: the checked path's turn
    assert driver.calls == []
    staged.rearm(STREAM)  # as the checked path leaves it after its launch
    spare = staged.spare
    driver.calls.clear()
    driver.current = CONTEXT
    references = sys.getrefcount(spare)
    got = staged.call(*batch, STREAM)
    assert got.shape == (2, 8) and got.data_ptr() == spare.data_ptr()
    del got  # the view, and with it the reference the object had on the spare, are gone
    after = sys.getrefcount(spare)  # (pytest keeps an assertion's values alive)
    assert after == references - 1
    following = staged.spare
    assert following is not None and following.data_ptr() != spare.data_ptr()
    assert staged.spare_stream == STREAM
    assert driver.kinds() == [("set", STAGE_NODE), ("launch", EXEC, STREAM),
                              ("set", OUTPUT_NODE)]
    assert staged.named == ((*(t.data_ptr() for t in batch), 8, 2), following.data_ptr())
    # A full bucket: the whole output, and the next launch's output named already.
    full = _batch(16)
    driver.calls.clear()
    got = staged.call(*full, STREAM)
    assert got.shape == (2, 16) and got.data_ptr() == following.data_ptr()
    assert driver.kinds() == [("set", STAGE_NODE), ("launch", EXEC, STREAM),
                              ("set", OUTPUT_NODE)]


@pytest.mark.parametrize("case", ["other stream", "spare of another stream", "int64 ids",
                                  "too many tokens", "too many sequences", "no tensor",
                                  "launch fails", "set fails"])
def test_call_hands_back_what_it_will_not_launch(module: Any, driver: Driver,
                                                 case: str) -> None:
    """Anything in the way gives None, with the spare kept as it was (the same tensor,
    its stream), so the checked path (``launch``) orders, refuses or raises."""
    staged = _with_call(module, driver)
    spare = torch.zeros(2, 16)
    staged.spare, staged.spare_stream = spare, STREAM
    batch, follows = _batch(), STREAM
    if case == "other stream":
        follows = STREAM + 1
    elif case == "spare of another stream":
        staged.spare_stream = STREAM + 1
    elif case == "int64 ids":
        batch[0] = batch[0].long()
    elif case == "too many tokens":
        batch = _batch(17)
    elif case == "too many sequences":
        batch[3] = torch.tensor([0, 1, 2, 3, 4, 8], dtype=torch.int32)
    elif case == "no tensor":
        batch[2] = None
    elif case == "launch fails":
        driver.fail["launch"] = 719
    else:
        driver.fail["set"] = 700
    references = sys.getrefcount(spare)
    assert staged.call(*batch, follows) is None
    after = sys.getrefcount(spare)  # (pytest keeps an assertion's values alive)
    assert after == references
    assert staged.spare is spare
    assert staged.spare_stream == (STREAM + 1 if case == "spare of another stream" else STREAM)
    launched = [c for c in driver.calls if c[0] == "launch"]
    assert launched == ([("launch", EXEC, STREAM)] if case == "launch fails" else [])
    if case == "launch fails":
        assert staged.failed == "cuGraphLaunch"
    elif case == "set fails":
        assert staged.failed == "cuGraphExecKernelNodeSetParams"


def test_call_after_its_launch(module: Any, driver: Driver) -> None:
    """Memory for the next output ran out: this call's logits come back and the next
    call makes its own (no spare). Another error making it is raised. A failed name of
    the next output leaves it unnamed, so the next launch sets it."""
    made: list[Any] = []

    def out_of_memory() -> Any:
        raise torch.OutOfMemoryError("no room")

    staged = _with_call(module, driver, out_of_memory)
    spare = torch.zeros(2, 16)
    staged.spare, staged.spare_stream = spare, STREAM
    assert staged.call(*_batch(), STREAM).data_ptr() == spare.data_ptr()
    assert staged.spare is None

    def broken() -> Any:
        raise KeyError("not memory")

    staged = _with_call(module, driver, broken)
    staged.spare, staged.spare_stream = torch.zeros(2, 16), STREAM
    with pytest.raises(KeyError):
        staged.call(*_batch(), STREAM)
    staged = _with_call(module, driver, lambda: "no tensor")
    staged.spare, staged.spare_stream = torch.zeros(2, 16), STREAM
    with pytest.raises(TypeError, match="no tensor"):
        staged.call(*_batch(), STREAM)
    # Launched, then the caller's context not restored: raised here, never launched twice.
    staged = _with_call(module, driver)
    staged.spare, staged.spare_stream = torch.zeros(2, 16), STREAM
    driver.current, driver.fail = 0x9000, {"restore": 202}
    driver.calls.clear()
    with pytest.raises(RuntimeError, match="cuCtxSetCurrent failed after the graph's launch"):
        staged.call(*_batch(), STREAM)
    assert [c for c in driver.calls if c[0] == "launch"] == [("launch", EXEC, STREAM)]
    assert staged.spare is None  # the output went with the launch; the next call makes one
    driver.fail = {}

    def fresh() -> Any:
        made.append(torch.zeros(2, 16))
        return made[-1]

    staged = _with_call(module, driver, fresh)
    first = torch.zeros(2, 16)
    batch = _batch()
    assert staged.launch(*batch, first, 16, 4, STREAM) == 0  # inputs and output named
    staged.spare, staged.spare_stream = first, STREAM
    driver.current = CONTEXT  # no context switches among the calls below
    driver.fail["set_output"] = 700
    driver.calls.clear()
    assert staged.call(*batch, STREAM).data_ptr() == first.data_ptr()
    assert driver.kinds()[-2:] == [("launch", EXEC, STREAM), ("set", OUTPUT_NODE)]
    assert staged.spare is made[0] and staged.named is None  # made, not named
    del driver.fail["set_output"]
    driver.calls.clear()
    assert staged.call(*batch, STREAM).data_ptr() == made[0].data_ptr()
    launch = driver.kinds().index(("launch", EXEC, STREAM))
    assert ("set", OUTPUT_NODE) in driver.kinds()[:launch]  # named before its launch
    assert staged.named is not None and staged.named[1] == made[1].data_ptr()


def test_call_needs_its_fields(module: Any, driver: Driver) -> None:
    plain = module.StagedLaunch(**driver.fields())
    with pytest.raises(RuntimeError, match="call"):
        plain.call(*_batch(), STREAM)
    with pytest.raises(ValueError, match="current_stream"):
        module.StagedLaunch(**driver.fields(max_tokens=16, max_seqs=4,
                                            current_stream=lambda d: STREAM))
    with pytest.raises(ValueError, match="max_tokens"):
        _with_call(module, driver).__init__(**driver.fields(
            max_tokens=0, max_seqs=4, current_stream=lambda d: STREAM,
            make_output=lambda: None, out_of_memory=torch.OutOfMemoryError))
    staged = _with_call(module, driver)
    with pytest.raises(TypeError):
        staged.spare = 5
    for wrong in (torch.zeros(2, 8), torch.zeros(2, 16, dtype=torch.float16), torch.zeros(32),
                  torch.zeros(16, 2).t()):  # what the graph could not write whole
        with pytest.raises(ValueError, match="float32"):
            staged.spare = wrong
    with pytest.raises(TypeError):
        staged.call(*_batch())


def test_bad_construction_is_refused(module: Any, driver: Driver) -> None:
    fields = driver.fields()
    with pytest.raises(ValueError, match="six"):
        module.StagedLaunch(**fields | {"stage_slots": fields["stage_slots"][:5]})
    with pytest.raises(ValueError, match="size 2"):
        module.StagedLaunch(**fields | {"output_slots": [(fields["output_slots"][0][0], 2)]})
    with pytest.raises(ValueError, match="null"):
        module.StagedLaunch(**fields | {"exec": 0})
    bare = module.StagedLaunch.__new__(module.StagedLaunch)
    with pytest.raises(RuntimeError, match="__init__"):
        bare.launch(*_batch(), None, 1, 1, 0)
    assert bare.failed == "" and bare.named is None


def test_the_build_is_keyed_by_source_and_failures_name_the_compiler_output(
        tmp_path: Path) -> None:
    source = tmp_path / "broken.cpp"
    source.write_text("int main( {\n")
    other = tmp_path / "other.cpp"
    other.write_text("int main( {}\n")
    assert staged_launch.target_path(tmp_path, source) != staged_launch.target_path(
        tmp_path, other)
    command = staged_launch.compile_command(source, tmp_path / "x.so")
    assert str(source) in command and "-ltorch_python" in command
    with pytest.raises(RuntimeError, match=r"compiling broken\.cpp failed"):
        staged_launch.build(tmp_path, source)
    assert not list(tmp_path.glob("*.partial")) and not list(tmp_path.glob("*.so"))


def test_make_falls_back_with_one_warning_and_one_attempt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = []

    def no_compiler(build_dir: Path = staged_launch.BUILD_DIR) -> Any:
        attempts.append(build_dir)
        raise RuntimeError("cannot run the C++ compiler 'c++'")

    monkeypatch.setattr(staged_launch, "load", no_compiler)
    monkeypatch.setattr(staged_launch, "_failure", None)
    with pytest.warns(RuntimeWarning, match=r"C\+\+ compiler.*Python path"):
        assert staged_launch.make() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert staged_launch.make() is None  # warned once per process
    assert len(attempts) == 1  # and built once: a failed compile is not redone
