// A call's path to its graph in compiled code: GraphCache.replay_into's tensor checks, the
// first kernel's input arguments and the last kernel's output argument set in the
// instantiated graph (cuGraphExecKernelNodeSetParams, only where they changed), and the
// launch (cuGraphLaunch), in the graph's context. The Python version of the same path
// (engine/fused/graphs.py, graph_args.py) stays as the fallback and the reference.
// call() is the engine's whole path for a batch size it has served before: it also takes
// the call's output (the spare tensor named after the previous call's launch) and, after
// the launch, makes and names the next call's, so no Python runs between the engine's
// route lookup and the launch (v35: 2.5-3 µs off the call's path before its launch).
//
// A CPython extension on torch's C++ headers (to read a tensor's metadata without Python
// attribute lookups); the driver is reached through function addresses the caller passes
// (ctypes' view of libcuda), so the module links no CUDA library and builds on machines
// without one. Built and loaded by engine/fused/staged_launch.py. The caller serialises
// calls on one object (the engine's lock); the GIL is released around the driver calls
// (a launch may block on a full queue), as ctypes releases it on the Python path.
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <cstring>

namespace {

using SetParamsFn = int (*)(void* exec, void* node, const void* params);
using GraphLaunchFn = int (*)(void* exec, void* stream);
using CtxGetFn = int (*)(void** context);
using CtxSetFn = int (*)(void* context);

constexpr int kMaxSlots = 8;
constexpr int kStageArgs = 6;  // kernels.STAGE_ARGS: ids, tt, pos, cu addresses; tokens, seqs
constexpr long long kNotInBucket = -1;
constexpr long long kTensorsMisfit = -2;

// Some arguments of one kernel node: where each lives in the parameter buffer its
// CUDA_KERNEL_NODE_PARAMS points into, its size (4 or 8 bytes, little-endian), and the
// values the driver last took (valid only after a set that succeeded).
struct Node {
  void* node = nullptr;
  const void* params = nullptr;
  int count = 0;
  char* at[kMaxSlots] = {};
  int size[kMaxSlots] = {};
  int64_t last[kMaxSlots] = {};
  bool valid = false;
};

struct StagedLaunch {
  PyObject_HEAD
  PyObject* owners;  // what owns the parameter buffers (kept alive with this object)
  void* exec;
  void* context;
  int device;
  SetParamsFn set_params;
  GraphLaunchFn graph_launch;
  CtxGetFn ctx_get;
  CtxSetFn ctx_set;
  Node stage;
  Node output;
  const char* failed;  // the driver call behind the last non-zero result
  bool restore_failed;  // and the caller's context could not be restored after it
  // call()'s: the bucket's limits, torch's current raw stream of `device` (a callable of
  // the device index), a maker of fresh [2, max_tokens] float32 outputs and the exception
  // it raises when memory ran out; the spare output (named to the graph already) and the
  // stream it was made for. A spare is also what launch()'s caller takes and puts back.
  int64_t max_tokens;
  int64_t max_seqs;
  PyObject* device_index;
  PyObject* current_stream;
  PyObject* make_output;
  PyObject* out_of_memory;
  PyObject* spare;
  int64_t spare_stream;
};

// The node's arguments for later launches: no driver call where they hold these already.
int set_node(StagedLaunch* self, Node& n, const int64_t* values) {
  if (n.valid && std::memcmp(n.last, values, sizeof(int64_t) * n.count) == 0) return 0;
  for (int i = 0; i < n.count; ++i) std::memcpy(n.at[i], &values[i], n.size[i]);
  n.valid = false;  // unknown until the driver has taken them
  int result = self->set_params(self->exec, n.node, n.params);
  if (result != 0) {
    self->failed = "cuGraphExecKernelNodeSetParams";
    return result;
  }
  std::memcpy(n.last, values, sizeof(int64_t) * n.count);
  n.valid = true;
  return 0;
}

int set_output(StagedLaunch* self, int64_t address) {
  int64_t values[kMaxSlots];
  for (int i = 0; i < self->output.count; ++i) values[i] = address;
  return set_node(self, self->output, values);
}

// Makes the graph's context current where it is not; *previous gets what to restore.
int enter(StagedLaunch* self, void** previous, bool* switched) {
  *switched = false;
  self->restore_failed = false;
  int result = self->ctx_get(previous);
  if (result != 0) {
    self->failed = "cuCtxGetCurrent";
    return result;
  }
  if (*previous == self->context) return 0;
  result = self->ctx_set(self->context);
  if (result != 0) {
    self->failed = "cuCtxSetCurrent";
    return result;
  }
  *switched = true;
  return 0;
}

// Restores the caller's context after enter(); a failure to restore is the result where
// nothing failed before it, else named beside the first failure (restore_failed).
int leave(StagedLaunch* self, void* previous, bool switched, int result) {
  if (!switched) return result;
  int restored = self->ctx_set(previous);
  if (restored == 0) return result;
  if (result == 0) {
    self->failed = "cuCtxSetCurrent";
    return restored;
  }
  self->restore_failed = true;
  return result;
}

bool parse_slots(PyObject* slots, Node& n, int expected) {
  PyObject* seq = PySequence_Fast(slots, "slots must be a sequence of (address, size)");
  if (seq == nullptr) return false;
  Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  if (count < 1 || count > kMaxSlots || (expected > 0 && count != expected)) {
    Py_DECREF(seq);
    PyErr_Format(PyExc_ValueError, "%zd argument slots (at most %d%s)", count, kMaxSlots,
                 expected > 0 ? ", and exactly the six of STAGE_ARGS for the stage" : "");
    return false;
  }
  for (Py_ssize_t i = 0; i < count; ++i) {
    unsigned long long address = 0;
    int size = 0;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "Ki", &address, &size)) {
      Py_DECREF(seq);
      return false;
    }
    if (size != 4 && size != 8) {
      Py_DECREF(seq);
      PyErr_Format(PyExc_ValueError, "argument size %d (4 or 8 bytes)", size);
      return false;
    }
    n.at[i] = reinterpret_cast<char*>(static_cast<uintptr_t>(address));
    n.size[i] = size;
  }
  n.count = static_cast<int>(count);
  Py_DECREF(seq);
  return true;
}

void* as_pointer(unsigned long long value) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(value));
}

int staged_init(PyObject* obj, PyObject* args, PyObject* kwargs) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  static const char* names[] = {"owners", "exec", "context", "device", "set_params",
                                "graph_launch", "ctx_get", "ctx_set", "stage_node",
                                "stage_params", "stage_slots", "output_node",
                                "output_params", "output_slots", "max_tokens", "max_seqs",
                                "current_stream", "make_output", "out_of_memory", nullptr};
  PyObject *owners = nullptr, *stage_slots = nullptr, *output_slots = nullptr;
  PyObject *current_stream = nullptr, *make_output = nullptr, *out_of_memory = nullptr;
  unsigned long long exec = 0, context = 0, set_params = 0, graph_launch = 0, ctx_get = 0,
                     ctx_set = 0, stage_node = 0, stage_params = 0, output_node = 0,
                     output_params = 0;
  long long max_tokens = 0, max_seqs = 0;
  int device = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OKKiKKKKKKOKKO|LLOOO",
                                   const_cast<char**>(names), &owners, &exec, &context,
                                   &device, &set_params, &graph_launch, &ctx_get, &ctx_set,
                                   &stage_node, &stage_params, &stage_slots, &output_node,
                                   &output_params, &output_slots, &max_tokens, &max_seqs,
                                   &current_stream, &make_output, &out_of_memory)) {
    return -1;
  }
  bool with_call = current_stream != nullptr || make_output != nullptr ||
                   out_of_memory != nullptr;
  if (with_call && (current_stream == nullptr || make_output == nullptr ||
                    out_of_memory == nullptr || !PyCallable_Check(current_stream) ||
                    !PyCallable_Check(make_output) || !PyExceptionClass_Check(out_of_memory) ||
                    max_tokens < 1 || max_seqs < 1)) {
    PyErr_SetString(PyExc_ValueError,
                    "call() needs max_tokens and max_seqs >= 1, callables current_stream and "
                    "make_output, and an exception class out_of_memory");
    return -1;
  }
  if (!exec || !context || !set_params || !graph_launch || !ctx_get || !ctx_set ||
      !stage_params || !output_params) {
    PyErr_SetString(PyExc_ValueError, "a null graph, context, driver function or parameters");
    return -1;
  }
  Node stage, output;
  if (!parse_slots(stage_slots, stage, kStageArgs) || !parse_slots(output_slots, output, 0)) {
    return -1;
  }
  PyObject* device_index = PyLong_FromLong(device);
  if (device_index == nullptr) return -1;
  stage.node = as_pointer(stage_node);
  stage.params = as_pointer(stage_params);
  output.node = as_pointer(output_node);
  output.params = as_pointer(output_params);
  Py_INCREF(owners);
  Py_XSETREF(self->owners, owners);
  self->exec = as_pointer(exec);
  self->context = as_pointer(context);
  self->device = device;
  self->set_params = reinterpret_cast<SetParamsFn>(as_pointer(set_params));
  self->graph_launch = reinterpret_cast<GraphLaunchFn>(as_pointer(graph_launch));
  self->ctx_get = reinterpret_cast<CtxGetFn>(as_pointer(ctx_get));
  self->ctx_set = reinterpret_cast<CtxSetFn>(as_pointer(ctx_set));
  self->stage = stage;
  self->output = output;
  self->failed = "";
  self->restore_failed = false;
  self->max_tokens = max_tokens;
  self->max_seqs = max_seqs;
  Py_XSETREF(self->device_index, device_index);
  Py_XINCREF(current_stream);
  Py_XSETREF(self->current_stream, current_stream);
  Py_XINCREF(make_output);
  Py_XSETREF(self->make_output, make_output);
  Py_XINCREF(out_of_memory);
  Py_XSETREF(self->out_of_memory, out_of_memory);
  Py_CLEAR(self->spare);
  self->spare_stream = 0;
  return 0;
}

void staged_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  Py_CLEAR(self->owners);
  Py_CLEAR(self->device_index);
  Py_CLEAR(self->current_stream);
  Py_CLEAR(self->make_output);
  Py_CLEAR(self->out_of_memory);
  Py_CLEAR(self->spare);
  Py_TYPE(obj)->tp_free(obj);
}

// False, with a Python error set, where __init__ has not succeeded (null function pointers).
bool ready(StagedLaunch* self) {
  if (self->graph_launch != nullptr) return true;
  PyErr_SetString(PyExc_RuntimeError, "StagedLaunch used before a successful __init__");
  return false;
}

bool read_ints(PyObject* const* args, Py_ssize_t n, int64_t* out) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = static_cast<int64_t>(PyLong_AsLongLong(args[i]));
    if (out[i] == -1 && PyErr_Occurred()) return false;
  }
  return true;
}

// name(ids, tt, pos, cu, tokens, seqs, out) -> CUresult: the inputs (STAGE_ARGS values) and
// the output address of later launches (_CallArgs.name).
PyObject* staged_name(PyObject* obj, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  if (!ready(self)) return nullptr;
  int64_t values[kStageArgs + 1];
  if (nargs != kStageArgs + 1) {
    PyErr_Format(PyExc_TypeError, "name takes %d integers", kStageArgs + 1);
    return nullptr;
  }
  if (!read_ints(args, nargs, values)) return nullptr;
  void* previous = nullptr;
  bool switched = false;
  int result;
  Py_BEGIN_ALLOW_THREADS
  result = enter(self, &previous, &switched);
  if (result == 0) {
    result = set_node(self, self->stage, values);
    if (result == 0) result = set_output(self, values[kStageArgs]);
  }
  result = leave(self, previous, switched, result);
  Py_END_ALLOW_THREADS
  return PyLong_FromLong(result);
}

// The output of later launches, inputs as last named, in the graph's context -> CUresult.
int name_output_at(StagedLaunch* self, int64_t address) {
  void* previous = nullptr;
  bool switched = false;
  int result;
  Py_BEGIN_ALLOW_THREADS
  result = enter(self, &previous, &switched);
  if (result == 0) result = set_output(self, address);
  result = leave(self, previous, switched, result);
  Py_END_ALLOW_THREADS
  return result;
}

int64_t address_of(PyObject* tensor) {
  return reinterpret_cast<intptr_t>(THPVariable_Unpack(tensor).data_ptr());
}

// After a launch on `stream`: the next call's output made (make_output) and named to the
// graph, kept as the spare for that stream. Out of memory: no spare (the next call makes
// its own output). A failed name leaves the output unnamed, so the next launch sets it
// (and reports a failure there). -1 with a Python error set where making it failed
// otherwise.
int rearm_spare(StagedLaunch* self, int64_t stream) {
  PyObject* next = PyObject_CallNoArgs(self->make_output);
  if (next == nullptr) {
    if (!PyErr_ExceptionMatches(self->out_of_memory)) return -1;
    PyErr_Clear();
    Py_CLEAR(self->spare);
    return 0;
  }
  if (!THPVariable_Check(next)) {
    Py_DECREF(next);
    PyErr_SetString(PyExc_TypeError, "make_output returned no tensor");
    return -1;
  }
  name_output_at(self, address_of(next));
  Py_XSETREF(self->spare, next);
  self->spare_stream = stream;
  return 0;
}

// rearm(stream) -> None: rearm_spare, for the checked path (GraphCache._replay_native)
// after its launch.
PyObject* staged_rearm(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  if (!ready(self)) return nullptr;
  if (self->make_output == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "StagedLaunch built without call()'s fields");
    return nullptr;
  }
  int64_t stream = 0;
  if (!read_ints(&arg, 1, &stream)) return nullptr;
  HANDLE_TH_ERRORS
  if (rearm_spare(self, stream) != 0) return nullptr;
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

// Whether the tensors can be handed to the graph as bare addresses: graphs.staged_tensors_fit.
bool staged_fit(const at::Tensor& ids, const at::Tensor& tt, const at::Tensor& pos,
                const at::Tensor& cu, int device) {
  const at::Tensor* all[4] = {&ids, &tt, &pos, &cu};
  for (const at::Tensor* t : all) {
    if (t->dim() != 1 || t->scalar_type() != at::kInt || t->get_device() != device ||
        !t->is_contiguous()) {
      return false;
    }
  }
  return tt.size(0) == ids.size(0) && pos.size(0) == ids.size(0) && cu.size(0) >= 1;
}

// The tensors' addresses and sizes set where they changed, the output named, the graph
// launched on `stream`, in its context -> CUresult (the failed call in self->failed).
int launch_staged(StagedLaunch* self, const at::Tensor& ids, const at::Tensor& tt,
                  const at::Tensor& pos, const at::Tensor& cu, int64_t out, int64_t on,
                  bool* launched) {
  int64_t values[kStageArgs] = {
      reinterpret_cast<intptr_t>(ids.data_ptr()), reinterpret_cast<intptr_t>(tt.data_ptr()),
      reinterpret_cast<intptr_t>(pos.data_ptr()), reinterpret_cast<intptr_t>(cu.data_ptr()),
      ids.size(0), cu.size(0) - 1};
  void* stream = as_pointer(static_cast<uint64_t>(on));
  void* previous = nullptr;
  bool switched = false;
  int result;
  Py_BEGIN_ALLOW_THREADS
  result = enter(self, &previous, &switched);
  if (result == 0) result = set_node(self, self->stage, values);
  if (result == 0) result = set_output(self, out);
  if (result == 0) {
    result = self->graph_launch(self->exec, stream);
    if (result != 0) self->failed = "cuGraphLaunch";
  }
  *launched = result == 0;
  result = leave(self, previous, switched, result);
  Py_END_ALLOW_THREADS
  return result;
}

// Whether the four tensors and their batch fit (0), else kTensorsMisfit or kNotInBucket;
// args[0..3] are ids, tt, pos, cu.
long long check_batch(StagedLaunch* self, PyObject* const* args, int64_t max_tokens,
                      int64_t max_seqs) {
  for (int i = 0; i < 4; ++i) {
    if (!THPVariable_Check(args[i])) return kTensorsMisfit;
  }
  const at::Tensor& ids = THPVariable_Unpack(args[0]);
  const at::Tensor& cu = THPVariable_Unpack(args[3]);
  if (!staged_fit(ids, THPVariable_Unpack(args[1]), THPVariable_Unpack(args[2]), cu,
                  self->device)) {
    return kTensorsMisfit;
  }
  if (ids.size(0) > max_tokens || cu.size(0) - 1 > max_seqs) return kNotInBucket;
  return 0;
}

// launch(ids, tt, pos, cu, out, max_tokens, max_seqs, stream) -> int: 0 launched,
// -1 the batch does not fit the bucket, -2 the tensors do not fit (staged_fit), else the
// CUresult of the driver call named by `failed`. Nothing is set or launched unless both fit.
PyObject* staged_launch(PyObject* obj, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  if (!ready(self)) return nullptr;
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError,
                    "launch(ids, tt, pos, cu, out, max_tokens, max_seqs, stream)");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  if (!THPVariable_Check(args[4])) return PyLong_FromLongLong(kTensorsMisfit);
  int64_t limits[3];
  if (!read_ints(args + 5, 3, limits)) return nullptr;
  long long fit = check_batch(self, args, limits[0], limits[1]);
  if (fit != 0) return PyLong_FromLongLong(fit);
  bool launched = false;
  return PyLong_FromLong(launch_staged(self, THPVariable_Unpack(args[0]),
                                       THPVariable_Unpack(args[1]), THPVariable_Unpack(args[2]),
                                       THPVariable_Unpack(args[3]), address_of(args[4]),
                                       limits[2], &launched));
  END_HANDLE_TH_ERRORS
}

// call(ids, tt, pos, cu, follows) -> Tensor | None: the launch on the spare output, where
// the current stream is `follows` (the stream of the cache's last call: no ordering to
// add) and the spare was made for it; then the next call's output (rearm_spare). Returns
// the logits [2, T] (a view where T < max_tokens), or None where anything stands in the way
// (another stream, no spare, tensors or a batch that do not fit, a driver failure before
// the launch): the caller then takes the checked path (launch()), which orders, refuses or
// raises. A failure after the launch (the caller's context not restored) raises here, so
// the graph is never launched twice.
PyObject* staged_call(PyObject* obj, PyObject* const* args, Py_ssize_t nargs) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  if (!ready(self)) return nullptr;
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "call(ids, tt, pos, cu, follows)");
    return nullptr;
  }
  if (self->make_output == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "StagedLaunch built without call()'s fields");
    return nullptr;
  }
  HANDLE_TH_ERRORS
  int64_t follows = 0;
  if (!read_ints(args + 4, 1, &follows)) return nullptr;
  PyObject* current = PyObject_CallOneArg(self->current_stream, self->device_index);
  if (current == nullptr) return nullptr;
  int64_t stream = static_cast<int64_t>(PyLong_AsLongLong(current));
  Py_DECREF(current);
  if (stream == -1 && PyErr_Occurred()) return nullptr;
  if (stream != follows || self->spare == nullptr || self->spare_stream != stream) {
    Py_RETURN_NONE;
  }
  if (check_batch(self, args, self->max_tokens, self->max_seqs) != 0) Py_RETURN_NONE;
  const at::Tensor& ids = THPVariable_Unpack(args[0]);
  int64_t tokens = ids.size(0);
  PyObject* out = self->spare;  // this call's now
  self->spare = nullptr;
  bool launched = false;
  int result = launch_staged(self, ids, THPVariable_Unpack(args[1]), THPVariable_Unpack(args[2]),
                             THPVariable_Unpack(args[3]), address_of(out), stream, &launched);
  if (result != 0 && !launched) {
    Py_XSETREF(self->spare, out);  // unused: the checked path launches on it or raises
    Py_RETURN_NONE;
  }
  if (result != 0) {  // launched, then the caller's context not restored
    Py_DECREF(out);  // freed in stream order: reused only after the graph has written it
    PyErr_Format(PyExc_RuntimeError,
                 "CUDA error: %s failed after the graph's launch (CUresult %d)", self->failed,
                 result);
    return nullptr;
  }
  if (rearm_spare(self, stream) != 0) {
    Py_DECREF(out);
    return nullptr;
  }
  if (tokens == self->max_tokens) return out;
  PyObject* view = THPVariable_Wrap(THPVariable_Unpack(out).narrow(1, 0, tokens));
  Py_DECREF(out);
  return view;
  END_HANDLE_TH_ERRORS
}

PyObject* staged_failed(PyObject* obj, void*) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  return PyUnicode_FromFormat(
      "%s%s", self->failed != nullptr ? self->failed : "",
      self->restore_failed ? " (and cuCtxSetCurrent, restoring the caller's context)" : "");
}

PyMethodDef staged_methods[] = {
    {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(staged_launch)),
     METH_FASTCALL, "launch(ids, tt, pos, cu, out, max_tokens, max_seqs, stream) -> int"},
    {"name", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(staged_name)),
     METH_FASTCALL, "name(ids, tt, pos, cu, tokens, seqs, out) -> CUresult"},
    {"rearm", staged_rearm, METH_O, "rearm(stream): the next call's output made and named"},
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(staged_call)),
     METH_FASTCALL, "call(ids, tt, pos, cu, follows) -> Tensor | None"},
    {nullptr, nullptr, 0, nullptr}};

// ((ids, tt, pos, cu, tokens, seqs), out) the driver holds for later launches, or None
// before both are set (_CallArgs.named).
PyObject* staged_named(PyObject* obj, void*) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  if (!self->stage.valid || !self->output.valid) Py_RETURN_NONE;
  const int64_t* v = self->stage.last;
  return Py_BuildValue("((LLLLLL)L)", static_cast<long long>(v[0]), static_cast<long long>(v[1]),
                       static_cast<long long>(v[2]), static_cast<long long>(v[3]),
                       static_cast<long long>(v[4]), static_cast<long long>(v[5]),
                       static_cast<long long>(self->output.last[0]));
}

PyObject* staged_get_spare(PyObject* obj, void*) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  PyObject* spare = self->spare != nullptr ? self->spare : Py_None;
  Py_INCREF(spare);
  return spare;
}

int staged_set_spare(PyObject* obj, PyObject* value, void*) {
  auto* self = reinterpret_cast<StagedLaunch*>(obj);
  if (value == nullptr || (value != Py_None && !THPVariable_Check(value))) {
    PyErr_SetString(PyExc_TypeError, "spare is a tensor or None");
    return -1;
  }
  if (value != Py_None) {  // what the graph's last kernel writes: all of it, in place
    const at::Tensor& t = THPVariable_Unpack(value);
    if (t.dim() != 2 || t.size(0) != 2 || (self->max_tokens > 0 && t.size(1) != self->max_tokens) ||
        t.scalar_type() != at::kFloat || t.get_device() != self->device || !t.is_contiguous()) {
      PyErr_SetString(PyExc_ValueError, "spare is a contiguous float32 [2, max_tokens] tensor "
                                        "on the graph's device");
      return -1;
    }
  }
  PyObject* old = self->spare;
  if (value == Py_None) {
    self->spare = nullptr;
  } else {
    Py_INCREF(value);
    self->spare = value;
  }
  Py_XDECREF(old);
  return 0;
}

PyObject* staged_get_spare_stream(PyObject* obj, void*) {
  return PyLong_FromLongLong(reinterpret_cast<StagedLaunch*>(obj)->spare_stream);
}

int staged_set_spare_stream(PyObject* obj, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_TypeError, "spare_stream cannot be deleted");
    return -1;
  }
  long long stream = PyLong_AsLongLong(value);
  if (stream == -1 && PyErr_Occurred()) return -1;
  reinterpret_cast<StagedLaunch*>(obj)->spare_stream = stream;
  return 0;
}

PyGetSetDef staged_getset[] = {
    {"failed", staged_failed, nullptr, "the driver call behind the last non-zero result",
     nullptr},
    {"spare", staged_get_spare, staged_set_spare,
     "the next call's output, named to the graph already, or None", nullptr},
    {"spare_stream", staged_get_spare_stream, staged_set_spare_stream,
     "the stream the spare was made for", nullptr},
    {"named", staged_named, nullptr, "the inputs and output later launches get, or None",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject StagedLaunchType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "qa_staged_launch",
                          "A staged graph launch in compiled code (GraphCache.replay_into).",
                          -1, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_qa_staged_launch() {
  StagedLaunchType.tp_name = "qa_staged_launch.StagedLaunch";
  StagedLaunchType.tp_basicsize = sizeof(StagedLaunch);
  StagedLaunchType.tp_flags = Py_TPFLAGS_DEFAULT;
  StagedLaunchType.tp_doc = "One graph's staged call path (see engine/fused/staged_launch.py).";
  StagedLaunchType.tp_new = PyType_GenericNew;
  StagedLaunchType.tp_init = staged_init;
  StagedLaunchType.tp_dealloc = staged_dealloc;
  StagedLaunchType.tp_methods = staged_methods;
  StagedLaunchType.tp_getset = staged_getset;
  if (PyType_Ready(&StagedLaunchType) < 0) return nullptr;
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  Py_INCREF(&StagedLaunchType);
  if (PyModule_AddObject(module, "StagedLaunch",
                         reinterpret_cast<PyObject*>(&StagedLaunchType)) < 0) {
    Py_DECREF(&StagedLaunchType);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
