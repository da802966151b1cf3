// _jax_ffi.cc - libattn's XLA FFI handlers: the forward and backward passes as custom calls of a
// JAX program, on the CPU and on CUDA (the JAX front-end, python/libattn/jax.py, docs/JAX.md).
//
// A thin layer over the public C API, written against the FFI headers jaxlib ships
// (jax.ffi.include_dir()); it includes no CUDA header and is compiled by the host compiler: the
// GPU work happens in the run-time module libattn_cuda.so (or libattn_cudnn.so) that the core
// loads. The module exports the handlers as PyCapsules, which libattn.jax registers with
// jax.ffi.register_ffi_target.
//
// The plan is chosen when the call is traced: the front-end plans the problem through libattn's
// executor (cache, cache file, autotuning per the policy, heuristics) and writes into the call's
// attributes the canonical problem string (attn.h's syntax; the handler's platform sets the
// device), the implementation and configuration chosen, the CPU threads and the dropout seed, and
// asks XLA for one more result, a byte buffer of the plan's workspace size. So a compiled
// executable always runs the kernel it was compiled with, its workspace comes from XLA's own
// allocator (stream-ordered on a GPU), and the handler allocates nothing.
//
// Operands: q, k, v, then the optional inputs the problem has, in attn_inputs' order: bias,
// mask, sinks, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k, q_descale, k_descale,
// v_descale (an f8e4m3 problem's factors, docs/FP8.md). Results: out, lse, workspace. The
// backward pass takes dout, q, k, v, out, lse and the same optional inputs, and returns dq, dk,
// dv, then dbias when the problem has a bias, dsinks when it has sinks, and the workspace.
//
// Plans: attn.h allows one thread at a time per context, and XLA runs custom calls from several
// threads at once (one per device of a CPU mesh), so each thread keeps its own context and plans,
// keyed by the attributes and the device; a repeated call costs one lookup. Under vmap, operands
// arrive with the vmapped axes in front (see run).
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <unordered_map>

#include "attn.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct PlanEntry {
  attn_plan *plan = nullptr;
  attn_problem problem;
  size_t forward_bytes = 0, backward_bytes = 0;
};

// One thread's context and plans.
struct ThreadState {
  attn_ctx *ctx = nullptr;
  int32_t num_threads = 0;
  std::unordered_map<std::string, PlanEntry> plans;
  std::string key;  // reused, so a lookup allocates nothing once its capacity suffices

  ~ThreadState() {
    for (auto &entry : plans) attn_plan_destroy(entry.second.plan);
    attn_ctx_destroy(ctx);
  }
};

ThreadState &thread_state() {
  static thread_local ThreadState state;
  return state;
}

// A status of the library as an FFI error carrying the context's message (which names the
// argument and the rule); XLA raises it in Python as the call's exception.
ffi::Error library_error(attn_ctx *ctx, attn_status status, const char *what) {
  std::string message = std::string("libattn ") + what + ": " + attn_ctx_last_error(ctx);
  if (status == ATTN_STATUS_INVALID_ARGUMENT) return ffi::Error::InvalidArgument(message);
  return ffi::Error::Internal(message);
}

// Unwraps an ErrorOr into `var`, or returns its error from a handler.
#define ATTN_FFI_TRY(var, expr)                      \
  auto var##_or = (expr);                            \
  if (var##_or.has_error()) return var##_or.error(); \
  auto var = *var##_or

// Whether `fold` calls of a problem, stacked along a leading (vmapped) axis, are one problem of
// fold x batch sequences: every input's batch dimension must stack with q's, so no shared
// sinks or broadcast bias/mask batch dimension, no per-tensor descale factors (one per call), and
// no packed sequences (their offsets restart).
bool foldable(const attn_problem &p) {
  return p.num_sinks == 0 && p.varlen == ATTN_VARLEN_NONE && p.descale != ATTN_DESCALE_TENSOR &&
         (!p.has_bias || p.bias_shape[0] == p.batch) &&
         (!p.has_mask || p.mask_shape[0] == p.batch);
}

// The plan of this call's problem on this thread, made on first use with the implementation and
// configuration the attributes name; fold > 1 plans the problem of that many calls stacked into
// the batch (a vmapped call, see run).
ffi::ErrorOr<PlanEntry *> get_plan(ThreadState &st, const ffi::Dictionary &attrs,
                                   attn_device device, int32_t ordinal, int64_t fold) {
  auto problem_text = attrs.get<std::string_view>("problem");
  auto impl = attrs.get<std::string_view>("impl");
  auto config = attrs.get<std::string_view>("config");
  if (problem_text.has_error()) return ffi::Unexpected(problem_text.error());
  if (impl.has_error()) return ffi::Unexpected(impl.error());
  if (config.has_error()) return ffi::Unexpected(config.error());

  std::string &key = st.key;
  key.clear();
  for (std::string_view part : {*problem_text, *impl, *config}) {
    key.append(part);
    key.push_back('\n');
  }
  key.append(std::to_string(static_cast<int>(device) * 1000 + ordinal));
  key.push_back('x');
  key.append(std::to_string(fold));
  auto found = st.plans.find(key);
  if (found != st.plans.end()) return &found->second;

  if (st.ctx == nullptr && attn_ctx_create(&st.ctx) != ATTN_STATUS_OK)
    return ffi::Unexpected(ffi::Error::Internal("libattn: cannot create a context"));
  PlanEntry entry;
  std::string text(*problem_text), impl_name(*impl), config_name(*config);
  attn_status status = attn_problem_parse(st.ctx, text.c_str(), &entry.problem);
  if (status != ATTN_STATUS_OK)
    return ffi::Unexpected(library_error(st.ctx, status, "problem attribute"));
  attn_problem &p = entry.problem;
  p.device = device;
  p.device_index = ordinal;
  if (fold > 1) {
    if (p.has_bias) p.bias_shape[0] *= fold;
    if (p.has_mask) p.mask_shape[0] *= fold;
    p.batch *= fold;
  }
  attn_select select;
  attn_select_init(&select);
  select.impl = impl_name.c_str();
  select.config = config_name.empty() ? nullptr : config_name.c_str();
  status = attn_plan_create(st.ctx, &p, &select, &entry.plan);
  if (status != ATTN_STATUS_OK) return ffi::Unexpected(library_error(st.ctx, status, "plan"));
  attn_plan_workspace_size(entry.plan, &entry.forward_bytes, &entry.backward_bytes);
  return &st.plans.emplace(key, entry).first->second;
}

// The buffers of one call as plain pointers and byte counts: operands and results, in order.
struct Buffers {
  static constexpr size_t kMax = 16;
  void *arg[kMax], *ret[kMax];
  size_t arg_bytes[kMax], ret_bytes[kMax];
  size_t nargs = 0, nrets = 0;
  int64_t q_rank = 0;
  int64_t q_dims[8];
};

ffi::ErrorOr<Buffers> buffers_of(const ffi::RemainingArgs &args, const ffi::RemainingRets &rets,
                                 size_t q_index) {
  Buffers b;
  if (args.size() > Buffers::kMax || rets.size() > Buffers::kMax || rets.size() < 3)
    return ffi::Unexpected(ffi::Error::InvalidArgument("libattn: wrong number of buffers"));
  for (size_t i = 0; i < args.size(); ++i) {
    auto buffer = args.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return ffi::Unexpected(buffer.error());
    b.arg[i] = buffer->untyped_data();
    b.arg_bytes[i] = buffer->size_bytes();
    if (i == q_index) {
      auto dims = buffer->dimensions();
      b.q_rank = static_cast<int64_t>(dims.size());
      if (b.q_rank > 8) return ffi::Unexpected(ffi::Error::InvalidArgument("libattn: rank > 8"));
      for (int64_t d = 0; d < b.q_rank; ++d) b.q_dims[d] = dims[d];
    }
  }
  b.nargs = args.size();
  for (size_t i = 0; i < rets.size(); ++i) {
    auto buffer = rets.get<ffi::AnyBuffer>(i);
    if (buffer.has_error()) return ffi::Unexpected(buffer.error());
    b.ret[i] = (*buffer)->untyped_data();
    b.ret_bytes[i] = (*buffer)->size_bytes();
  }
  b.nrets = rets.size();
  return b;
}

// The optional inputs, from operand `first` on, as the problem declares them; false when the
// operands do not match the problem.
bool bind_optional(const attn_problem &p, void *const *arg, size_t nargs, size_t first,
                   attn_inputs *in) {
  size_t next = first;
  auto take = [&]() -> void * { return next < nargs ? arg[next++] : (++next, nullptr); };
  if (p.has_bias) in->bias = attn_tensor_dense(take());
  if (p.has_mask) in->mask = attn_tensor_dense(take());
  if (p.num_sinks > 0) in->sinks = attn_tensor_dense(take());
  if (p.has_segment_ids) {
    in->q_segment_ids = attn_tensor_dense(take());
    in->kv_segment_ids = attn_tensor_dense(take());
  }
  if (p.varlen == ATTN_VARLEN_PACKED) {
    in->cu_seqlens_q = static_cast<const int32_t *>(take());
    in->cu_seqlens_k = static_cast<const int32_t *>(take());
  }
  if (p.descale != ATTN_DESCALE_NONE) {
    in->q_descale = attn_tensor_dense(take());
    in->k_descale = attn_tensor_dense(take());
    in->v_descale = attn_tensor_dense(take());
  }
  return next == nargs;
}

// One pass of a plan over buffers given as pointers (one slice of a stacked call, or all of it);
// the last result is the workspace.
attn_status run_pass(bool backward, const PlanEntry &entry, void *const *arg, size_t nargs,
                     void *const *ret, size_t nrets, uint64_t seed, size_t ws_bytes) {
  const attn_problem &p = entry.problem;
  void *ws = ws_bytes > 0 ? ret[nrets - 1] : nullptr;
  attn_inputs in;
  attn_inputs_init(&in);
  size_t q = backward ? 1 : 0;
  in.q = attn_tensor_dense(arg[q]);
  in.k = attn_tensor_dense(arg[q + 1]);
  in.v = attn_tensor_dense(arg[q + 2]);
  in.dropout_seed = seed;
  if (!bind_optional(p, arg, nargs, backward ? 6 : 3, &in)) return ATTN_STATUS_INVALID_ARGUMENT;
  if (!backward) {
    attn_outputs out;
    attn_outputs_init(&out);
    out.out = attn_tensor_dense(ret[0]);
    out.lse = attn_tensor_dense(ret[1]);
    return attn_plan_forward(entry.plan, &in, ws, ws_bytes, &out);
  }
  attn_outputs fwd;
  attn_outputs_init(&fwd);
  fwd.out = attn_tensor_dense(arg[4]);
  fwd.lse = attn_tensor_dense(arg[5]);
  attn_tensor dout = attn_tensor_dense(arg[0]);
  attn_grads grads;
  attn_grads_init(&grads);
  grads.dq = attn_tensor_dense(ret[0]);
  grads.dk = attn_tensor_dense(ret[1]);
  grads.dv = attn_tensor_dense(ret[2]);
  size_t next = 3;
  if (p.has_bias) grads.dbias = attn_tensor_dense(ret[next++]);
  if (p.num_sinks > 0) grads.dsinks = attn_tensor_dense(ret[next++]);
  return attn_plan_backward(entry.plan, &in, &fwd, &dout, ws, ws_bytes, &grads);
}

// A forward or backward call. Under vmap (vmap_method="broadcast_all") every buffer carries the
// same leading axes in front of the problem's shapes (q of rank 5 instead of 4, or 4 instead of
// 3 for packed sequences): their product n of stacked calls runs as one problem of n x batch
// sequences when the inputs stack along the batch (foldable) and the n workspaces together are
// enough for it, else slice by slice with the same plan, each slice 1/n of every buffer.
ffi::Error run(bool backward, attn_device device, int32_t ordinal, void *stream,
               ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  ThreadState &st = thread_state();
  const char *what = backward ? "backward" : "forward";
  ATTN_FFI_TRY(entry, get_plan(st, attrs, device, ordinal, 1));
  auto seed = attrs.get<int64_t>("seed");
  auto threads = attrs.get<int64_t>("num_threads");
  if (seed.has_error()) return seed.error();
  if (threads.has_error()) return threads.error();
  ATTN_FFI_TRY(b, buffers_of(args, rets, backward ? 1 : 0));
  int64_t base_rank = entry->problem.varlen == ATTN_VARLEN_PACKED ? 3 : 4;
  int64_t stacked = 1;
  for (int64_t d = 0; d + base_rank < b.q_rank; ++d) stacked *= b.q_dims[d];
  if (stacked == 0) return ffi::Error::Success();
  size_t ws_total = b.ret_bytes[b.nrets - 1];
  int64_t passes = stacked;
  if (stacked > 1 && foldable(entry->problem)) {
    auto folded = get_plan(st, attrs, device, ordinal, stacked);
    if (folded.has_value() &&
        (backward ? (*folded)->backward_bytes : (*folded)->forward_bytes) <= ws_total) {
      entry = *folded;
      passes = 1;
    }
  }
  size_t ws_bytes = backward ? entry->backward_bytes : entry->forward_bytes;
  if (ws_bytes > ws_total / passes)
    return ffi::Error::InvalidArgument(
        std::string("libattn ") + what + ": the workspace result holds " +
        std::to_string(ws_total / passes) + " bytes, the plan needs " + std::to_string(ws_bytes));
  attn_status status = ATTN_STATUS_OK;
  if (st.num_threads != *threads) {
    status = attn_ctx_set_num_threads(st.ctx, static_cast<int32_t>(*threads));
    if (status == ATTN_STATUS_OK) st.num_threads = static_cast<int32_t>(*threads);
  }
  if (status == ATTN_STATUS_OK) status = attn_plan_set_stream(entry->plan, stream);
  for (int64_t n = 0; n < passes && status == ATTN_STATUS_OK; ++n) {
    void *arg[Buffers::kMax], *ret[Buffers::kMax];
    for (size_t i = 0; i < b.nargs; ++i)
      arg[i] = static_cast<char *>(b.arg[i]) + n * (b.arg_bytes[i] / passes);
    for (size_t i = 0; i < b.nrets; ++i)
      ret[i] = static_cast<char *>(b.ret[i]) + n * (b.ret_bytes[i] / passes);
    status = run_pass(backward, *entry, arg, b.nargs, ret, b.nrets,
                      static_cast<uint64_t>(*seed), ws_bytes);
  }
  if (status != ATTN_STATUS_OK) {
    if (attn_ctx_last_status(st.ctx) == ATTN_STATUS_OK)  // operands that do not match
      return ffi::Error::InvalidArgument(std::string("libattn ") + what + ": " +
                                         std::to_string(b.nargs) +
                                         " operands do not match the problem attribute");
    return library_error(st.ctx, status, what);
  }
  return ffi::Error::Success();
}

ffi::Error forward_cpu(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return run(false, ATTN_DEVICE_CPU, 0, nullptr, args, rets, attrs);
}

ffi::Error backward_cpu(ffi::RemainingArgs args, ffi::RemainingRets rets,
                        ffi::Dictionary attrs) {
  return run(true, ATTN_DEVICE_CPU, 0, nullptr, args, rets, attrs);
}

ffi::Error forward_cuda(void *stream, int32_t ordinal, ffi::RemainingArgs args,
                        ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return run(false, ATTN_DEVICE_CUDA, ordinal, stream, args, rets, attrs);
}

ffi::Error backward_cuda(void *stream, int32_t ordinal, ffi::RemainingArgs args,
                         ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return run(true, ATTN_DEVICE_CUDA, ordinal, stream, args, rets, attrs);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(attn_jax_forward_cpu, forward_cpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(attn_jax_backward_cpu, backward_cpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(attn_jax_forward_cuda, forward_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(attn_jax_backward_cuda, backward_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());

// ---- the Python module -------------------------------------------------------------------------

namespace {

PyObject *capsule(void *handler) { return PyCapsule_New(handler, nullptr, nullptr); }

// {platform: {"forward": capsule, "backward": capsule}} for jax.ffi.register_ffi_target.
PyObject *handlers(PyObject *, PyObject *) {
  PyObject *cpu = Py_BuildValue("{s:N,s:N}", "forward",
                                capsule(reinterpret_cast<void *>(attn_jax_forward_cpu)),
                                "backward",
                                capsule(reinterpret_cast<void *>(attn_jax_backward_cpu)));
  PyObject *cuda = Py_BuildValue("{s:N,s:N}", "forward",
                                 capsule(reinterpret_cast<void *>(attn_jax_forward_cuda)),
                                 "backward",
                                 capsule(reinterpret_cast<void *>(attn_jax_backward_cuda)));
  if (cpu == nullptr || cuda == nullptr) {
    Py_XDECREF(cpu);
    Py_XDECREF(cuda);
    return nullptr;
  }
  return Py_BuildValue("{s:N,s:N}", "cpu", cpu, "CUDA", cuda);
}

// select_mechanism(name) -> (operation or -1, platform): attn_select_mechanism's reading of a
// mechanism or platform name, so the front-end checks a name with the library's own rule and
// message before it traces a call.
PyObject *select_mechanism(PyObject *, PyObject *args) {
  const char *name;
  if (!PyArg_ParseTuple(args, "s", &name)) return nullptr;
  attn_ctx *ctx = nullptr;
  if (attn_ctx_create(&ctx) != ATTN_STATUS_OK) return PyErr_NoMemory();
  attn_problem problem;
  attn_problem_init(&problem);
  problem.operation = -1;
  attn_select select;
  attn_select_init(&select);
  attn_status status = attn_select_mechanism(ctx, name, &problem, &select);
  PyObject *result = nullptr;
  if (status == ATTN_STATUS_OK)
    result = Py_BuildValue("(ii)", problem.operation, select.platform);
  else
    PyErr_SetString(PyExc_ValueError, attn_ctx_last_error(ctx));
  attn_ctx_destroy(ctx);
  return result;
}

PyMethodDef methods[] = {
    {"handlers", handlers, METH_NOARGS, "The FFI handlers as capsules, by platform."},
    {"select_mechanism", select_mechanism, METH_VARARGS,
     "(operation or -1, platform) of a mechanism or platform name (attn_select_mechanism)."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jax_ffi",
                      "libattn's XLA FFI handlers for the JAX front-end (private).", -1, methods,
                      nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__jax_ffi(void) { return PyModule_Create(&module); }
