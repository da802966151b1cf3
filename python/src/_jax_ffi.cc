// _jax_ffi.cc - libattn's XLA FFI handlers: the forward and backward passes as custom calls of a
// JAX program, on the CPU and on CUDA (the JAX front-end, python/libattn/jax.py, docs/JAX.md).
//
// A thin layer over the public C API, written against the FFI headers jaxlib ships
// (jax.ffi.include_dir()); it includes no CUDA header and is compiled by the host compiler: the
// GPU work happens in the run-time module libattn_cuda.so (or libattn_cudnn.so) that the core
// loads. The module exports the handlers as PyCapsules, which libattn.jax registers with
// jax.ffi.register_ffi_target.
//
// A call carries its problem as attributes: the canonical problem string (attn.h's syntax, the
// device left out: the handler's platform sets it), the mechanism or platform name, the
// implementation and configuration asked for, the executor's policy and the dropout seed. The
// operands are q, k, v and then the optional inputs the problem says it has, in the order of
// attn_inputs: bias, mask, sinks, q_segment_ids, kv_segment_ids, cu_seqlens_q, cu_seqlens_k.
// The backward pass takes dout, q, k, v, out, lse and the same optional inputs, and returns dq,
// dk, dv, then dbias when the problem has a bias and dsinks when it has sinks.
//
// Plans: attn.h allows one thread at a time per context, and XLA runs custom calls from several
// threads at once (one per device of a CPU mesh), so each thread keeps its own context and its
// own plans, keyed by everything that decides the plan; a repeated call costs one lookup.
// Workspace: on CUDA from XLA's allocator (the FFI scratch allocator, stream-ordered, pooled by
// XLA), on the CPU a per-thread buffer that only grows; the handler itself never allocates per
// call once warm.
#include <Python.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "attn.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Optional operands, in the order the front-end passes them after q, k, v (after dout, q, k, v,
// out, lse in the backward pass).
struct Optional {
  attn_tensor bias, mask, sinks, q_segment_ids, kv_segment_ids;
  const int32_t *cu_seqlens_q, *cu_seqlens_k;
};

struct PlanEntry {
  attn_plan *plan = nullptr;
  attn_problem problem;
  size_t forward_bytes = 0, backward_bytes = 0;
};

// One thread's context, plans and CPU workspace.
struct ThreadState {
  attn_ctx *ctx = nullptr;
  std::unordered_map<std::string, PlanEntry> plans;
  std::string key;  // reused, so a lookup allocates nothing once its capacity suffices
  void *workspace = nullptr;
  size_t workspace_bytes = 0;

  ~ThreadState() {
    for (auto &entry : plans) attn_plan_destroy(entry.second.plan);
    attn_ctx_destroy(ctx);
    std::free(workspace);
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

template <typename T>
ffi::ErrorOr<T> attr(const ffi::Dictionary &attrs, const char *name) {
  return attrs.get<T>(name);
}

// The policy attribute: "allow_autotune,on_miss,tune_backward,warmup_iters,measure_iters,
// max_seconds,persist,deterministic,num_threads" (libattn.jax writes it from get_policy()).
bool parse_policy(std::string_view text, attn_policy *policy, int32_t *num_threads) {
  std::string s(text);
  int allow, on_miss, tune_bwd, warmup, measure, persist, deterministic, threads;
  double seconds;
  if (std::sscanf(s.c_str(), "%d,%d,%d,%d,%d,%lf,%d,%d,%d", &allow, &on_miss, &tune_bwd, &warmup,
                  &measure, &seconds, &persist, &deterministic, &threads) != 9)
    return false;
  policy->allow_autotune = allow;
  policy->on_miss = on_miss;
  policy->tune_backward = tune_bwd;
  policy->warmup_iters = warmup;
  policy->measure_iters = measure;
  policy->max_seconds = seconds;
  policy->persist = persist;
  policy->deterministic = deterministic;
  *num_threads = threads;
  return true;
}

// The plan of this call's problem on this thread, made on first use.
ffi::ErrorOr<PlanEntry *> get_plan(ThreadState &st, const ffi::Dictionary &attrs,
                                   attn_device device, int32_t ordinal) {
  auto problem_text = attr<std::string_view>(attrs, "problem");
  auto mechanism = attr<std::string_view>(attrs, "mechanism");
  auto impl = attr<std::string_view>(attrs, "impl");
  auto config = attr<std::string_view>(attrs, "config");
  auto policy_text = attr<std::string_view>(attrs, "policy");
  auto cache_path = attr<std::string_view>(attrs, "cache_path");
  if (problem_text.has_error()) return ffi::Unexpected(problem_text.error());
  if (mechanism.has_error()) return ffi::Unexpected(mechanism.error());
  if (impl.has_error()) return ffi::Unexpected(impl.error());
  if (config.has_error()) return ffi::Unexpected(config.error());
  if (policy_text.has_error()) return ffi::Unexpected(policy_text.error());
  if (cache_path.has_error()) return ffi::Unexpected(cache_path.error());

  std::string &key = st.key;
  key.clear();
  for (std::string_view part : {*problem_text, *mechanism, *impl, *config, *policy_text,
                                *cache_path}) {
    key.append(part);
    key.push_back('\n');
  }
  key.append(std::to_string(static_cast<int>(device) * 1000 + ordinal));
  auto found = st.plans.find(key);
  if (found != st.plans.end()) return &found->second;

  if (st.ctx == nullptr && attn_ctx_create(&st.ctx) != ATTN_STATUS_OK)
    return ffi::Unexpected(ffi::Error::Internal("libattn: cannot create a context (out of memory)"));
  PlanEntry entry;
  std::string text(*problem_text);
  attn_status status = attn_problem_parse(st.ctx, text.c_str(), &entry.problem);
  if (status != ATTN_STATUS_OK) return ffi::Unexpected(library_error(st.ctx, status, "problem attribute"));
  entry.problem.device = device;
  entry.problem.device_index = ordinal;

  attn_policy policy;
  attn_policy_init(&policy);
  int32_t num_threads = 0;
  if (!parse_policy(*policy_text, &policy, &num_threads))
    return ffi::Unexpected(ffi::Error::InvalidArgument("libattn: policy attribute is malformed"));
  std::string path(*cache_path);
  // "\x01" stands for "the default path" (NULL): an empty string means "no cache file".
  policy.cache_path = path == "\x01" ? nullptr : path.c_str();
  status = attn_ctx_set_policy(st.ctx, &policy);
  if (status == ATTN_STATUS_OK) status = attn_ctx_set_num_threads(st.ctx, num_threads);
  if (status != ATTN_STATUS_OK) return ffi::Unexpected(library_error(st.ctx, status, "policy"));

  attn_select select;
  attn_select_init(&select);
  std::string mech(*mechanism), impl_name(*impl), config_name(*config);
  status = attn_select_mechanism(st.ctx, mech.c_str(), &entry.problem, &select);
  if (status != ATTN_STATUS_OK) return ffi::Unexpected(library_error(st.ctx, status, "platform"));
  select.impl = impl_name.empty() ? nullptr : impl_name.c_str();
  select.config = config_name.empty() ? nullptr : config_name.c_str();
  status = attn_plan_create(st.ctx, &entry.problem, &select, &entry.plan);
  if (status != ATTN_STATUS_OK) return ffi::Unexpected(library_error(st.ctx, status, "plan"));
  attn_plan_workspace_size(entry.plan, &entry.forward_bytes, &entry.backward_bytes);
  return &st.plans.emplace(key, entry).first->second;
}

attn_tensor tensor_of(const ffi::AnyBuffer &buffer) {
  return attn_tensor_dense(buffer.untyped_data());
}

// The optional operands from index `first` on, as the problem declares them.
ffi::ErrorOr<Optional> optional_operands(const attn_problem &p, const ffi::RemainingArgs &args,
                                         size_t first) {
  Optional o;
  std::memset(&o, 0, sizeof o);
  size_t next = first;
  auto take = [&](attn_tensor *t) -> ffi::Error {
    auto buffer = args.get<ffi::AnyBuffer>(next++);
    if (buffer.has_error()) return buffer.error();
    *t = tensor_of(*buffer);
    return ffi::Error::Success();
  };
  if (p.has_bias)
    if (auto e = take(&o.bias); e.failure()) return ffi::Unexpected(e);
  if (p.has_mask)
    if (auto e = take(&o.mask); e.failure()) return ffi::Unexpected(e);
  if (p.num_sinks > 0)
    if (auto e = take(&o.sinks); e.failure()) return ffi::Unexpected(e);
  if (p.has_segment_ids) {
    if (auto e = take(&o.q_segment_ids); e.failure()) return ffi::Unexpected(e);
    if (auto e = take(&o.kv_segment_ids); e.failure()) return ffi::Unexpected(e);
  }
  if (p.varlen == ATTN_VARLEN_PACKED) {
    attn_tensor cu_q, cu_k;
    if (auto e = take(&cu_q); e.failure()) return ffi::Unexpected(e);
    if (auto e = take(&cu_k); e.failure()) return ffi::Unexpected(e);
    o.cu_seqlens_q = static_cast<const int32_t *>(cu_q.data);
    o.cu_seqlens_k = static_cast<const int32_t *>(cu_k.data);
  }
  if (next != args.size())
    return ffi::Unexpected(ffi::Error::InvalidArgument("libattn: " + std::to_string(args.size()) +
                                       " operands, the problem takes " + std::to_string(next)));
  return o;
}

ffi::ErrorOr<attn_tensor> operand(const ffi::RemainingArgs &args, size_t index) {
  auto buffer = args.get<ffi::AnyBuffer>(index);
  if (buffer.has_error()) return ffi::Unexpected(buffer.error());
  return tensor_of(*buffer);
}

ffi::ErrorOr<attn_tensor> result(const ffi::RemainingRets &rets, size_t index) {
  auto buffer = rets.get<ffi::AnyBuffer>(index);
  if (buffer.has_error()) return ffi::Unexpected(buffer.error());
  return tensor_of(**buffer);
}

// Workspace of `bytes` for one call: XLA's scratch memory on a GPU, the thread's buffer on the CPU.
ffi::ErrorOr<void *> workspace(ThreadState &st, ffi::ScratchAllocator *scratch, size_t bytes) {
  if (bytes == 0) return static_cast<void *>(nullptr);
  if (scratch != nullptr) {
    auto data = scratch->Allocate(bytes, 256);
    if (!data.has_value())
      return ffi::Unexpected(ffi::Error::Internal("libattn: XLA's scratch allocator gave no workspace of " +
                                  std::to_string(bytes) + " bytes"));
    return *data;
  }
  if (bytes > st.workspace_bytes) {
    void *grown = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (grown == nullptr) return ffi::Unexpected(ffi::Error::Internal("libattn: out of memory for workspace"));
    std::free(st.workspace);
    st.workspace = grown;
    st.workspace_bytes = bytes;
  }
  return st.workspace;
}

ffi::ErrorOr<uint64_t> seed_of(const ffi::Dictionary &attrs) {
  auto seed = attrs.get<int64_t>("seed");
  if (seed.has_error()) return ffi::Unexpected(seed.error());
  return static_cast<uint64_t>(*seed);
}

#define ATTN_FFI_TRY(var, expr)            \
  auto var##_or = (expr);                  \
  if (var##_or.has_error()) return var##_or.error(); \
  auto var = *var##_or

ffi::Error forward(attn_device device, int32_t ordinal, void *stream,
                   ffi::ScratchAllocator *scratch, ffi::RemainingArgs args,
                   ffi::RemainingRets rets, ffi::Dictionary attrs) {
  ThreadState &st = thread_state();
  ATTN_FFI_TRY(entry, get_plan(st, attrs, device, ordinal));
  ATTN_FFI_TRY(opt, optional_operands(entry->problem, args, 3));
  ATTN_FFI_TRY(seed, seed_of(attrs));
  attn_inputs in;
  attn_inputs_init(&in);
  ATTN_FFI_TRY(q, operand(args, 0));
  ATTN_FFI_TRY(k, operand(args, 1));
  ATTN_FFI_TRY(v, operand(args, 2));
  in.q = q, in.k = k, in.v = v;
  in.bias = opt.bias, in.mask = opt.mask, in.sinks = opt.sinks;
  in.q_segment_ids = opt.q_segment_ids, in.kv_segment_ids = opt.kv_segment_ids;
  in.cu_seqlens_q = opt.cu_seqlens_q, in.cu_seqlens_k = opt.cu_seqlens_k;
  in.dropout_seed = seed;
  attn_outputs out;
  attn_outputs_init(&out);
  ATTN_FFI_TRY(o, result(rets, 0));
  ATTN_FFI_TRY(lse, result(rets, 1));
  out.out = o, out.lse = lse;
  ATTN_FFI_TRY(ws, workspace(st, scratch, entry->forward_bytes));
  attn_status status = attn_plan_set_stream(entry->plan, stream);
  if (status == ATTN_STATUS_OK)
    status = attn_plan_forward(entry->plan, &in, ws, entry->forward_bytes, &out);
  if (status != ATTN_STATUS_OK) return library_error(st.ctx, status, "forward");
  return ffi::Error::Success();
}

ffi::Error backward(attn_device device, int32_t ordinal, void *stream,
                    ffi::ScratchAllocator *scratch, ffi::RemainingArgs args,
                    ffi::RemainingRets rets, ffi::Dictionary attrs) {
  ThreadState &st = thread_state();
  ATTN_FFI_TRY(entry, get_plan(st, attrs, device, ordinal));
  ATTN_FFI_TRY(opt, optional_operands(entry->problem, args, 6));
  ATTN_FFI_TRY(seed, seed_of(attrs));
  ATTN_FFI_TRY(dout, operand(args, 0));
  ATTN_FFI_TRY(q, operand(args, 1));
  ATTN_FFI_TRY(k, operand(args, 2));
  ATTN_FFI_TRY(v, operand(args, 3));
  ATTN_FFI_TRY(o, operand(args, 4));
  ATTN_FFI_TRY(lse, operand(args, 5));
  attn_inputs in;
  attn_inputs_init(&in);
  in.q = q, in.k = k, in.v = v;
  in.bias = opt.bias, in.mask = opt.mask, in.sinks = opt.sinks;
  in.q_segment_ids = opt.q_segment_ids, in.kv_segment_ids = opt.kv_segment_ids;
  in.cu_seqlens_q = opt.cu_seqlens_q, in.cu_seqlens_k = opt.cu_seqlens_k;
  in.dropout_seed = seed;
  attn_outputs fwd;
  attn_outputs_init(&fwd);
  fwd.out = o, fwd.lse = lse;
  attn_grads grads;
  attn_grads_init(&grads);
  ATTN_FFI_TRY(dq, result(rets, 0));
  ATTN_FFI_TRY(dk, result(rets, 1));
  ATTN_FFI_TRY(dv, result(rets, 2));
  grads.dq = dq, grads.dk = dk, grads.dv = dv;
  size_t next = 3;
  if (entry->problem.has_bias) {
    ATTN_FFI_TRY(dbias, result(rets, next++));
    grads.dbias = dbias;
  }
  if (entry->problem.num_sinks > 0) {
    ATTN_FFI_TRY(dsinks, result(rets, next++));
    grads.dsinks = dsinks;
  }
  ATTN_FFI_TRY(ws, workspace(st, scratch, entry->backward_bytes));
  attn_status status = attn_plan_set_stream(entry->plan, stream);
  if (status == ATTN_STATUS_OK)
    status =
        attn_plan_backward(entry->plan, &in, &fwd, &dout, ws, entry->backward_bytes, &grads);
  if (status != ATTN_STATUS_OK) return library_error(st.ctx, status, "backward");
  return ffi::Error::Success();
}

ffi::Error forward_cpu(ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return forward(ATTN_DEVICE_CPU, 0, nullptr, nullptr, args, rets, attrs);
}

ffi::Error backward_cpu(ffi::RemainingArgs args, ffi::RemainingRets rets,
                        ffi::Dictionary attrs) {
  return backward(ATTN_DEVICE_CPU, 0, nullptr, nullptr, args, rets, attrs);
}

ffi::Error forward_cuda(void *stream, ffi::ScratchAllocator scratch, int32_t ordinal,
                        ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return forward(ATTN_DEVICE_CUDA, ordinal, stream, &scratch, args, rets, attrs);
}

ffi::Error backward_cuda(void *stream, ffi::ScratchAllocator scratch, int32_t ordinal,
                         ffi::RemainingArgs args, ffi::RemainingRets rets,
                         ffi::Dictionary attrs) {
  return backward(ATTN_DEVICE_CUDA, ordinal, stream, &scratch, args, rets, attrs);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(attn_jax_forward_cpu, forward_cpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(attn_jax_backward_cpu, backward_cpu,
                              ffi::Ffi::Bind().RemainingArgs().RemainingRets().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(attn_jax_forward_cuda, forward_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::ScratchAllocator>()
                                  .Ctx<ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(attn_jax_backward_cuda, backward_cuda,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<void *>>()
                                  .Ctx<ffi::ScratchAllocator>()
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
