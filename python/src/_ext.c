/*
 * python/src/_ext.c - libattn._ext, the one binding every Python front-end shares.
 *
 * A thin layer over attn.h on the CPython API: tensors cross it as integers (a data pointer and
 * strides in elements), so it links neither PyTorch nor any other framework and one build works
 * with every framework version. It was chosen over ctypes by measurement (docs/PYTHON.md): ctypes
 * builds and converts the attn_inputs/attn_outputs structures field by field in Python, which
 * costs tens of microseconds per call; here the conversion is a loop over a tuple in C.
 *
 * Objects are capsules: a context (attn_ctx) and plans made from it. A plan capsule keeps a
 * reference to its context's capsule, so the context is destroyed after its last plan, as attn.h
 * requires. The library runs with the GIL released; the Python side keeps one context per thread
 * (attn.h: one thread at a time per context), so no two threads ever share a context.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <attn.h>

#include <stddef.h>
#include <string.h>

static PyObject *attn_error_type;  /* libattn.Error(RuntimeError) */
static PyObject *invalid_arg_type; /* libattn.InvalidArgument(Error, ValueError) */
static PyObject *unsupported_type; /* libattn.Unsupported(Error) */

static const char ctx_capsule_name[] = "libattn.ctx";
static const char plan_capsule_name[] = "libattn.plan";

/* Raises the exception of a failed status with the context's message. Returns NULL. */
static PyObject *raise_status(attn_status status, const char *message) {
  PyObject *type = attn_error_type;
  if (status == ATTN_STATUS_INVALID_ARGUMENT) type = invalid_arg_type;
  if (status == ATTN_STATUS_UNSUPPORTED) type = unsupported_type;
  if (status == ATTN_STATUS_OUT_OF_MEMORY) type = PyExc_MemoryError;
  PyErr_Format(type, "%s: %s", attn_status_string(status),
               message != NULL && message[0] != '\0' ? message : "(no message)");
  return NULL;
}

static attn_ctx *get_ctx(PyObject *capsule) {
  return (attn_ctx *)PyCapsule_GetPointer(capsule, ctx_capsule_name);
}

static attn_plan *get_plan(PyObject *capsule) {
  return (attn_plan *)PyCapsule_GetPointer(capsule, plan_capsule_name);
}

static void ctx_destructor(PyObject *capsule) { attn_ctx_destroy(get_ctx(capsule)); }

static void plan_destructor(PyObject *capsule) {
  attn_plan_destroy(get_plan(capsule));
  /* The context outlives its plans: the plan held a reference to the context's capsule. */
  PyObject *ctx = (PyObject *)PyCapsule_GetContext(capsule);
  Py_XDECREF(ctx);
}

static PyObject *ext_ctx_new(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  attn_ctx *ctx = NULL;
  attn_status status = attn_ctx_create(&ctx);
  if (status != ATTN_STATUS_OK) return raise_status(status, "attn_ctx_create failed");
  PyObject *capsule = PyCapsule_New(ctx, ctx_capsule_name, ctx_destructor);
  if (capsule == NULL) attn_ctx_destroy(ctx);
  return capsule;
}

/* ---- problems and inputs: tuples laid out by the tables below ----------------------------------
 *
 * A problem crosses as a tuple of attn_problem's fields and a run's inputs as a tuple of
 * attn_inputs' fields, each in the order of its table here: the one place of the layout. Python
 * reads the names (problem_fields, input_fields), so a front-end builds tuples by name or by
 * position in that order. A tuple may stop early: the fields past its end keep attn_problem_init's
 * (attn_inputs_init's) values, so a front-end that does not use a field added later passes the
 * same tuple as before. A field added to attn.h is one line in its table, appended at the end. */

typedef enum field_kind { FIELD_I32, FIELD_I64, FIELD_F64 } field_kind;

typedef struct problem_field {
  const char *name;
  field_kind kind;
  size_t offset;
} problem_field;

#define PROBLEM_FIELD(name, member, kind) {name, kind, offsetof(attn_problem, member)}
#define PROBLEM_SHAPE(name, member, d)                                                            \
  {name, FIELD_I64, offsetof(attn_problem, member) + (d) * sizeof(int64_t)}

static const problem_field problem_layout[] = {
    PROBLEM_FIELD("operation", operation, FIELD_I32),
    PROBLEM_FIELD("dtype", dtype, FIELD_I32),
    PROBLEM_FIELD("device", device, FIELD_I32),
    PROBLEM_FIELD("device_index", device_index, FIELD_I32),
    PROBLEM_FIELD("batch", batch, FIELD_I64),
    PROBLEM_FIELD("seqlen_q", seqlen_q, FIELD_I64),
    PROBLEM_FIELD("seqlen_k", seqlen_k, FIELD_I64),
    PROBLEM_FIELD("heads_q", heads_q, FIELD_I64),
    PROBLEM_FIELD("heads_kv", heads_kv, FIELD_I64),
    PROBLEM_FIELD("head_dim", head_dim, FIELD_I64),
    PROBLEM_FIELD("head_dim_v", head_dim_v, FIELD_I64),
    PROBLEM_FIELD("scale", scale, FIELD_F64),
    PROBLEM_FIELD("causal", causal, FIELD_I32),
    PROBLEM_FIELD("align", align, FIELD_I32),
    PROBLEM_FIELD("window_left", window_left, FIELD_I64),
    PROBLEM_FIELD("window_right", window_right, FIELD_I64),
    PROBLEM_FIELD("softcap", softcap, FIELD_F64),
    PROBLEM_FIELD("dropout_p", dropout_p, FIELD_F64),
    PROBLEM_FIELD("has_bias", has_bias, FIELD_I32),
    PROBLEM_FIELD("bias_dtype", bias_dtype, FIELD_I32),
    PROBLEM_SHAPE("bias_shape0", bias_shape, 0),
    PROBLEM_SHAPE("bias_shape1", bias_shape, 1),
    PROBLEM_SHAPE("bias_shape2", bias_shape, 2),
    PROBLEM_SHAPE("bias_shape3", bias_shape, 3),
    PROBLEM_FIELD("has_mask", has_mask, FIELD_I32),
    PROBLEM_SHAPE("mask_shape0", mask_shape, 0),
    PROBLEM_SHAPE("mask_shape1", mask_shape, 1),
    PROBLEM_SHAPE("mask_shape2", mask_shape, 2),
    PROBLEM_SHAPE("mask_shape3", mask_shape, 3),
    PROBLEM_FIELD("alibi", alibi, FIELD_I32),
    PROBLEM_FIELD("num_sinks", num_sinks, FIELD_I64),
    PROBLEM_FIELD("sinks_shared", sinks_shared, FIELD_I32),
    PROBLEM_FIELD("has_segment_ids", has_segment_ids, FIELD_I32),
    PROBLEM_FIELD("varlen", varlen, FIELD_I32),
    PROBLEM_FIELD("total_q", total_q, FIELD_I64),
    PROBLEM_FIELD("total_k", total_k, FIELD_I64),
    /* Appended after the first 36: fp8 (docs/FP8.md), then the paged KV cache (docs/DECODE.md). */
    PROBLEM_FIELD("out_dtype", out_dtype, FIELD_I32),
    PROBLEM_FIELD("descale", descale, FIELD_I32),
    PROBLEM_FIELD("page_size", page_size, FIELD_I64),
    PROBLEM_FIELD("num_pages", num_pages, FIELD_I64),
    PROBLEM_FIELD("max_pages_per_seq", max_pages_per_seq, FIELD_I64),
    PROBLEM_FIELD("seqlen_new", seqlen_new, FIELD_I64),
};

enum { PROBLEM_FIELDS = (int)(sizeof problem_layout / sizeof problem_layout[0]) };

/* The names of a table's fields, as a tuple of str: each entry of the table (`stride` bytes)
 * begins with its name, a const char *. */
static PyObject *field_names(const void *table, size_t stride, Py_ssize_t count) {
  PyObject *names = PyTuple_New(count);
  for (Py_ssize_t i = 0; names != NULL && i < count; ++i) {
    const char *name;
    memcpy(&name, (const char *)table + (size_t)i * stride, sizeof name);
    PyObject *item = PyUnicode_FromString(name);
    if (item == NULL) Py_CLEAR(names);
    else PyTuple_SET_ITEM(names, i, item);
  }
  return names;
}

static int problem_from_tuple(PyObject *tuple, attn_problem *p) {
  if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > PROBLEM_FIELDS) {
    PyErr_Format(PyExc_TypeError, "problem: expected a tuple of at most %d fields",
                 PROBLEM_FIELDS);
    return -1;
  }
  attn_problem_init(p);
  char *base = (char *)p;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); ++i) {
    const problem_field *f = &problem_layout[i];
    PyObject *item = PyTuple_GET_ITEM(tuple, i);
    if (f->kind == FIELD_F64) {
      double d = PyFloat_AsDouble(item);
      if (d == -1.0 && PyErr_Occurred()) return -1;
      memcpy(base + f->offset, &d, sizeof d);
      continue;
    }
    long long v = PyLong_AsLongLong(item);
    if (v == -1 && PyErr_Occurred()) return -1;
    if (f->kind == FIELD_I64) {
      int64_t v64 = (int64_t)v;
      memcpy(base + f->offset, &v64, sizeof v64);
    } else if (v < INT32_MIN || v > INT32_MAX) {
      PyErr_Format(PyExc_OverflowError, "problem: %s=%lld does not fit in int32", f->name, v);
      return -1;
    } else {
      int32_t v32 = (int32_t)v;
      memcpy(base + f->offset, &v32, sizeof v32);
    }
  }
  return 0;
}

static PyObject *problem_to_tuple(const attn_problem *p) {
  PyObject *tuple = PyTuple_New(PROBLEM_FIELDS);
  const char *base = (const char *)p;
  for (Py_ssize_t i = 0; tuple != NULL && i < PROBLEM_FIELDS; ++i) {
    const problem_field *f = &problem_layout[i];
    PyObject *item;
    if (f->kind == FIELD_F64) {
      double d;
      memcpy(&d, base + f->offset, sizeof d);
      item = PyFloat_FromDouble(d);
    } else if (f->kind == FIELD_I64) {
      int64_t v64;
      memcpy(&v64, base + f->offset, sizeof v64);
      item = PyLong_FromLongLong((long long)v64);
    } else {
      int32_t v32;
      memcpy(&v32, base + f->offset, sizeof v32);
      item = PyLong_FromLong((long)v32);
    }
    if (item == NULL) Py_CLEAR(tuple);
    else PyTuple_SET_ITEM(tuple, i, item);
  }
  return tuple;
}

static PyObject *ext_problem_fields(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  return field_names(problem_layout, sizeof problem_layout[0], PROBLEM_FIELDS);
}

static PyObject *ext_problem_default(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  attn_problem p;
  attn_problem_init(&p);
  return problem_to_tuple(&p);
}

static PyObject *ext_problem_string(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *tuple;
  if (!PyArg_ParseTuple(args, "O", &tuple)) return NULL;
  attn_problem p;
  if (problem_from_tuple(tuple, &p) != 0) return NULL;
  char buf[1024];
  attn_problem_to_string(&p, buf, sizeof buf);
  return PyUnicode_FromString(buf);
}

static PyObject *ext_problem_parse(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ctx_obj;
  const char *text;
  if (!PyArg_ParseTuple(args, "Os", &ctx_obj, &text)) return NULL;
  attn_ctx *ctx = get_ctx(ctx_obj);
  if (ctx == NULL) return NULL;
  attn_problem p;
  attn_status status = attn_problem_parse(ctx, text, &p);
  if (status != ATTN_STATUS_OK) return raise_status(status, attn_ctx_last_error(ctx));
  return problem_to_tuple(&p);
}

/* ---- plans ---------------------------------------------------------------------------------- */

static PyObject *ext_plan_new(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ctx_obj, *tuple;
  const char *impl = NULL, *config = NULL;
  int platform = 0, backend = 0;
  if (!PyArg_ParseTuple(args, "OOzzii", &ctx_obj, &tuple, &impl, &config, &platform, &backend))
    return NULL;
  attn_ctx *ctx = get_ctx(ctx_obj);
  if (ctx == NULL) return NULL;
  attn_problem p;
  if (problem_from_tuple(tuple, &p) != 0) return NULL;
  attn_select select;
  attn_select_init(&select);
  select.impl = impl;
  select.config = config;
  select.platform = platform;
  select.backend = backend;
  attn_plan *plan = NULL;
  attn_status status;
  /* Autotuning may take seconds: other Python threads run meanwhile (this context is ours). */
  PyThreadState *save = PyEval_SaveThread();
  status = attn_plan_create(ctx, &p, &select, &plan);
  PyEval_RestoreThread(save);
  if (status != ATTN_STATUS_OK) {
    return raise_status(status, attn_ctx_last_error(ctx));
  }
  PyObject *capsule = PyCapsule_New(plan, plan_capsule_name, plan_destructor);
  if (capsule == NULL) {
    attn_plan_destroy(plan);
    return NULL;
  }
  Py_INCREF(ctx_obj);
  if (PyCapsule_SetContext(capsule, ctx_obj) != 0) {
    Py_DECREF(ctx_obj);
    Py_DECREF(capsule); /* the destructor destroys the plan */
    return NULL;
  }
  return capsule;
}

/* (implementation, configuration, forward workspace bytes, backward workspace bytes) */
static PyObject *ext_plan_info(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *plan_obj;
  if (!PyArg_ParseTuple(args, "O", &plan_obj)) return NULL;
  attn_plan *plan = get_plan(plan_obj);
  if (plan == NULL) return NULL;
  size_t fwd = 0, bwd = 0;
  attn_plan_workspace_size(plan, &fwd, &bwd);
  return Py_BuildValue("(ssnn)", attn_plan_impl_name(plan), attn_plan_config_name(plan),
                       (Py_ssize_t)fwd, (Py_ssize_t)bwd);
}

/* A tensor is None (not given) or a tuple (data pointer, stride0, stride1, ...) of at most
 * 1 + ATTN_MAX_DIMS integers; the strides are in elements, in the order of attn.h's shapes. */
static int tensor_from(PyObject *obj, attn_tensor *t) {
  memset(t, 0, sizeof *t);
  if (obj == Py_None) return 0;
  if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) < 1 ||
      PyTuple_GET_SIZE(obj) > 1 + ATTN_MAX_DIMS) {
    PyErr_SetString(PyExc_TypeError, "tensor: expected None or (data_ptr, *strides)");
    return -1;
  }
  t->data = PyLong_AsVoidPtr(PyTuple_GET_ITEM(obj, 0));
  if (t->data == NULL && PyErr_Occurred()) return -1;
  for (Py_ssize_t d = 1; d < PyTuple_GET_SIZE(obj); ++d) {
    t->stride[d - 1] = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, d));
    if (t->stride[d - 1] == -1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

static int pointer_from(PyObject *obj, const int32_t **out) {
  *out = NULL;
  if (obj == Py_None) return 0;
  *out = (const int32_t *)PyLong_AsVoidPtr(obj);
  return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* The inputs tuple, laid out by input_layout: a tensor is None or (data_ptr, *strides), an index
 * array a data pointer or None, the seed an integer (taken modulo 2**64). */
typedef enum input_kind { INPUT_TENSOR, INPUT_POINTER, INPUT_SEED } input_kind;

typedef struct input_field {
  const char *name;
  input_kind kind;
  size_t offset;
} input_field;

#define INPUT_FIELD(member, kind) {#member, kind, offsetof(attn_inputs, member)}

static const input_field input_layout[] = {
    INPUT_FIELD(q, INPUT_TENSOR),
    INPUT_FIELD(k, INPUT_TENSOR),
    INPUT_FIELD(v, INPUT_TENSOR),
    INPUT_FIELD(bias, INPUT_TENSOR),
    INPUT_FIELD(mask, INPUT_TENSOR),
    INPUT_FIELD(alibi_slopes, INPUT_TENSOR),
    INPUT_FIELD(sinks, INPUT_TENSOR),
    INPUT_FIELD(q_segment_ids, INPUT_TENSOR),
    INPUT_FIELD(kv_segment_ids, INPUT_TENSOR),
    INPUT_FIELD(cu_seqlens_q, INPUT_POINTER),
    INPUT_FIELD(cu_seqlens_k, INPUT_POINTER),
    INPUT_FIELD(seqlens_q, INPUT_POINTER),
    INPUT_FIELD(seqlens_k, INPUT_POINTER),
    INPUT_FIELD(dropout_seed, INPUT_SEED),
    /* Appended after the first 14: fp8's factors (docs/FP8.md), then the paged KV cache's. */
    INPUT_FIELD(q_descale, INPUT_TENSOR),
    INPUT_FIELD(k_descale, INPUT_TENSOR),
    INPUT_FIELD(v_descale, INPUT_TENSOR),
    INPUT_FIELD(block_table, INPUT_TENSOR),
    INPUT_FIELD(cache_seqlens, INPUT_POINTER),
    INPUT_FIELD(k_new, INPUT_TENSOR),
    INPUT_FIELD(v_new, INPUT_TENSOR),
};

enum { INPUT_FIELDS = (int)(sizeof input_layout / sizeof input_layout[0]) };

static int inputs_from(PyObject *tuple, attn_inputs *in) {
  if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) > INPUT_FIELDS) {
    PyErr_Format(PyExc_TypeError, "inputs: expected a tuple of at most %d items", INPUT_FIELDS);
    return -1;
  }
  attn_inputs_init(in);
  char *base = (char *)in;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tuple); ++i) {
    const input_field *f = &input_layout[i];
    PyObject *item = PyTuple_GET_ITEM(tuple, i);
    if (f->kind == INPUT_TENSOR) {
      attn_tensor t;
      if (tensor_from(item, &t) != 0) return -1;
      memcpy(base + f->offset, &t, sizeof t);
    } else if (f->kind == INPUT_POINTER) {
      const int32_t *p;
      if (pointer_from(item, &p) != 0) return -1;
      memcpy(base + f->offset, &p, sizeof p);
    } else {
      uint64_t seed = (uint64_t)PyLong_AsUnsignedLongLongMask(item);
      if (PyErr_Occurred()) return -1;
      memcpy(base + f->offset, &seed, sizeof seed);
    }
  }
  return 0;
}

static PyObject *ext_input_fields(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  return field_names(input_layout, sizeof input_layout[0], INPUT_FIELDS);
}

/* Stream: an integer cudaStream_t (0 = the default stream) or None for a CPU plan. */
static int set_stream(attn_plan *plan, PyObject *stream) {
  if (stream == Py_None) return 0;
  void *s = PyLong_AsVoidPtr(stream);
  if (s == NULL && PyErr_Occurred()) return -1;
  attn_plan_set_stream(plan, s);
  return 0;
}

/* The workspace argument: None (the plan's own) or an address as an int. -1 with the exception set. */
static int workspace_from(PyObject *obj, void **ws) {
  *ws = obj == Py_None ? NULL : PyLong_AsVoidPtr(obj);
  return PyErr_Occurred() ? -1 : 0;
}

/* The exception for a failed run of the plan in plan_obj, with its context's message. */
static PyObject *raise_plan_error(PyObject *plan_obj, attn_status status) {
  PyObject *ctx_obj = (PyObject *)PyCapsule_GetContext(plan_obj);
  return raise_status(status, attn_ctx_last_error(get_ctx(ctx_obj)));
}

/* forward(plan, inputs, out, lse, probs, stream, workspace_ptr, workspace_bytes) */
static PyObject *ext_forward(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *plan_obj, *inputs_obj, *out_obj, *lse_obj, *probs_obj, *stream, *ws_obj;
  Py_ssize_t ws_size;
  if (!PyArg_ParseTuple(args, "OOOOOOOn", &plan_obj, &inputs_obj, &out_obj, &lse_obj, &probs_obj,
                        &stream, &ws_obj, &ws_size))
    return NULL;
  attn_plan *plan = get_plan(plan_obj);
  if (plan == NULL) return NULL;
  attn_inputs in;
  attn_outputs outs;
  attn_outputs_init(&outs);
  if (inputs_from(inputs_obj, &in) != 0 || tensor_from(out_obj, &outs.out) != 0 ||
      tensor_from(lse_obj, &outs.lse) != 0 || tensor_from(probs_obj, &outs.probs) != 0 ||
      set_stream(plan, stream) != 0)
    return NULL;
  void *ws;
  if (workspace_from(ws_obj, &ws) != 0) return NULL;
  attn_status status;
  PyThreadState *save = PyEval_SaveThread();
  status = attn_plan_forward(plan, &in, ws, (size_t)ws_size, &outs);
  PyEval_RestoreThread(save);
  if (status != ATTN_STATUS_OK) return raise_plan_error(plan_obj, status);
  Py_RETURN_NONE;
}

/* backward(plan, inputs, out, lse, dout, dq, dk, dv, dbias, dsinks, stream, workspace_ptr,
 * workspace_bytes) */
static PyObject *ext_backward(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *plan_obj, *inputs_obj, *out_obj, *lse_obj, *dout_obj, *dq_obj, *dk_obj, *dv_obj,
      *dbias_obj, *dsinks_obj, *stream, *ws_obj;
  Py_ssize_t ws_size;
  if (!PyArg_ParseTuple(args, "OOOOOOOOOOOOn", &plan_obj, &inputs_obj, &out_obj, &lse_obj,
                        &dout_obj, &dq_obj, &dk_obj, &dv_obj, &dbias_obj, &dsinks_obj, &stream,
                        &ws_obj, &ws_size))
    return NULL;
  attn_plan *plan = get_plan(plan_obj);
  if (plan == NULL) return NULL;
  attn_inputs in;
  attn_outputs fwd;
  attn_outputs_init(&fwd);
  attn_grads grads;
  attn_grads_init(&grads);
  attn_tensor dout;
  if (inputs_from(inputs_obj, &in) != 0 || tensor_from(out_obj, &fwd.out) != 0 ||
      tensor_from(lse_obj, &fwd.lse) != 0 || tensor_from(dout_obj, &dout) != 0 ||
      tensor_from(dq_obj, &grads.dq) != 0 || tensor_from(dk_obj, &grads.dk) != 0 ||
      tensor_from(dv_obj, &grads.dv) != 0 || tensor_from(dbias_obj, &grads.dbias) != 0 ||
      tensor_from(dsinks_obj, &grads.dsinks) != 0 || set_stream(plan, stream) != 0)
    return NULL;
  void *ws;
  if (workspace_from(ws_obj, &ws) != 0) return NULL;
  attn_status status;
  PyThreadState *save = PyEval_SaveThread();
  status = attn_plan_backward(plan, &in, &fwd, &dout, ws, (size_t)ws_size, &grads);
  PyEval_RestoreThread(save);
  if (status != ATTN_STATUS_OK) return raise_plan_error(plan_obj, status);
  Py_RETURN_NONE;
}

/* bench_forward(plan, inputs, out, lse, iterations, workspace_ptr, workspace_bytes) -> seconds per
 * call of attn_plan_forward made from C: the C API's own cost, the baseline the binding's overhead
 * is measured against. A GPU plan runs on the stream last set (asynchronously: the caller
 * synchronises around the call). */
static PyObject *ext_bench_forward(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *plan_obj, *inputs_obj, *out_obj, *lse_obj, *ws_obj;
  Py_ssize_t iterations, ws_size;
  if (!PyArg_ParseTuple(args, "OOOOnOn", &plan_obj, &inputs_obj, &out_obj, &lse_obj, &iterations,
                        &ws_obj, &ws_size))
    return NULL;
  attn_plan *plan = get_plan(plan_obj);
  if (plan == NULL) return NULL;
  attn_inputs in;
  attn_outputs outs;
  attn_outputs_init(&outs);
  if (inputs_from(inputs_obj, &in) != 0 || tensor_from(out_obj, &outs.out) != 0 ||
      tensor_from(lse_obj, &outs.lse) != 0)
    return NULL;
  void *ws;
  if (workspace_from(ws_obj, &ws) != 0) return NULL;
  PyObject *time_mod = PyImport_ImportModule("time");
  if (time_mod == NULL) return NULL;
  PyObject *t0 = PyObject_CallMethod(time_mod, "perf_counter", NULL);
  attn_status status = ATTN_STATUS_OK;
  for (Py_ssize_t i = 0; i < iterations && status == ATTN_STATUS_OK; ++i)
    status = attn_plan_forward(plan, &in, ws, (size_t)ws_size, &outs);
  PyObject *t1 = PyObject_CallMethod(time_mod, "perf_counter", NULL);
  Py_DECREF(time_mod);
  if (t0 == NULL || t1 == NULL) {
    Py_XDECREF(t0);
    Py_XDECREF(t1);
    return NULL;
  }
  double seconds = PyFloat_AsDouble(t1) - PyFloat_AsDouble(t0);
  Py_DECREF(t0);
  Py_DECREF(t1);
  if (status != ATTN_STATUS_OK) return raise_status(status, "attn_plan_forward failed");
  return PyFloat_FromDouble(iterations > 0 ? seconds / (double)iterations : 0.0);
}

/* ---- the front-ends' memo: a repeated call in one C call ---------------------------------------
 *
 * A front-end checks a call in Python the first time it sees a call of its kind, then keeps what it
 * derived (the plan, how to allocate the outputs) in its thread's dict under a key made of
 * everything those checks read: the call's options and, per tensor, its shape, strides, dtype and
 * device. memo_forward makes that key from the tensors' Python attributes (shape, stride(), dtype,
 * device, data_ptr(), requires_grad: PyTorch's tensor protocol; nothing links the framework) and,
 * on a hit, allocates the outputs through the entry's callables and runs the plan, so a repeated
 * call costs one call from Python instead of a page of Python (docs/PYTHON.md, the overhead). A
 * call that records autograd goes through the front-end's autograd hook, whose forward and
 * backward are memo_run and memo_backward. A miss returns None: the front-end takes its checked
 * path, which adds the entry.
 *
 * An entry is a tuple: (plan, bhtd, out alloc, lse alloc, return_lse, forward workspace alloc or
 * None, its bytes, backward workspace alloc or None, its bytes, stream function or None, its
 * argument). An alloc is (callable, kwargs or None), called as callable(q, **kwargs); bhtd says
 * the tensors are [B, H, T, D] (their strides are passed as attn.h's [B, T, H, D], no copy); the
 * stream function gives the cudaStream_t of the tensors' device's current stream. */

enum { MEMO_TENSORS = 3, MEMO_FIELDS = 4 }; /* q, k, v; per tensor: shape, strides, dtype, device */
enum {
  ENTRY_PLAN,
  ENTRY_BHTD,
  ENTRY_OUT,
  ENTRY_LSE,
  ENTRY_RETURN_LSE,
  ENTRY_FWD_WS,
  ENTRY_FWD_WS_BYTES,
  ENTRY_BWD_WS,
  ENTRY_BWD_WS_BYTES,
  ENTRY_STREAM,
  ENTRY_STREAM_ARG,
  ENTRY_SIZE
};

static PyObject *str_shape, *str_stride, *str_dtype, *str_device, *str_data_ptr, *str_requires_grad;
static PyObject *memo_tensor_type;  /* the only type memo_forward takes; NULL: never hooked */
static PyObject *memo_grad_enabled; /* () -> truthy when autograd records */
static PyObject *memo_guards;       /* tuple of () -> truthy: the call must take the checked path */
static PyObject *memo_autograd;     /* (entry, key, q, k, v) -> the result, recording autograd */
static PyObject *memo_empty_like;   /* (t) -> a new tensor like t: the gradients */

/* memo_hooks(tensor_type, grad_enabled, guards, autograd, empty_like): what the memo needs to
 * know of the framework. */
static PyObject *ext_memo_hooks(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *type, *grad_enabled, *guards, *autograd, *empty_like;
  if (!PyArg_ParseTuple(args, "O!OO!OO", &PyType_Type, &type, &grad_enabled, &PyTuple_Type, &guards,
                        &autograd, &empty_like))
    return NULL;
  PyObject **slots[] = {&memo_tensor_type, &memo_grad_enabled, &memo_guards, &memo_autograd,
                        &memo_empty_like};
  PyObject *values[] = {type, grad_enabled, guards, autograd, empty_like};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; ++i) {
    Py_INCREF(values[i]);
    Py_XSETREF(*slots[i], values[i]);
  }
  Py_RETURN_NONE;
}

/* The key of (options, q, k, v): (options, q.shape, q.stride(), q.dtype, q.device, k.shape, ...).
 * A new tuple, or NULL with the exception set. */
static PyObject *memo_key_of(PyObject *options, PyObject *const *tensors) {
  PyObject *key = PyTuple_New(1 + MEMO_TENSORS * MEMO_FIELDS);
  if (key == NULL) return NULL;
  Py_INCREF(options);
  PyTuple_SET_ITEM(key, 0, options);
  Py_ssize_t at = 1;
  for (int i = 0; i < MEMO_TENSORS; ++i) {
    PyObject *t = tensors[i];
    PyObject *fields[MEMO_FIELDS] = {NULL, NULL, NULL, NULL};
    /* One at a time: no call is made with an exception pending. */
    if ((fields[0] = PyObject_GetAttr(t, str_shape)) == NULL ||
        (fields[1] = PyObject_CallMethodNoArgs(t, str_stride)) == NULL ||
        (fields[2] = PyObject_GetAttr(t, str_dtype)) == NULL ||
        (fields[3] = PyObject_GetAttr(t, str_device)) == NULL) {
      for (int f = 0; f < MEMO_FIELDS; ++f) Py_XDECREF(fields[f]);
      Py_DECREF(key);
      return NULL;
    }
    for (int f = 0; f < MEMO_FIELDS; ++f) PyTuple_SET_ITEM(key, at++, fields[f]);
  }
  return key;
}

/* The strides of tensor i of a key. Borrowed. */
static PyObject *key_strides(PyObject *key, int i) {
  return PyTuple_GET_ITEM(key, 2 + i * MEMO_FIELDS);
}

/* 1 when fn() is truthy, 0 when not, -1 with the exception set. */
static int call_truthy(PyObject *fn) {
  PyObject *result = PyObject_CallNoArgs(fn);
  int truthy = result == NULL ? -1 : PyObject_IsTrue(result);
  Py_XDECREF(result);
  return truthy;
}

enum { GATE_NO = 0, GATE_INFERENCE = 1, GATE_AUTOGRAD = 2 };

/* Whether the call may take the memo: every tensor of the hooked type and no guard up; then
 * GATE_AUTOGRAD when autograd records (a tensor requires grad, grad mode on), else
 * GATE_INFERENCE. -1 with the exception set. */
static int memo_gate(PyObject *const *tensors) {
  if (memo_tensor_type == NULL) return GATE_NO;
  int wants_grad = 0;
  for (int i = 0; i < MEMO_TENSORS; ++i) {
    if ((PyObject *)Py_TYPE(tensors[i]) != memo_tensor_type) return GATE_NO;
    PyObject *flag = PyObject_GetAttr(tensors[i], str_requires_grad);
    int set = flag == NULL ? -1 : PyObject_IsTrue(flag);
    Py_XDECREF(flag);
    if (set < 0) return -1;
    wants_grad |= set;
  }
  if (wants_grad && (wants_grad = call_truthy(memo_grad_enabled)) < 0) return -1;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(memo_guards); ++i) {
    int up = call_truthy(PyTuple_GET_ITEM(memo_guards, i));
    if (up != 0) return up < 0 ? -1 : GATE_NO;
  }
  return wants_grad ? GATE_AUTOGRAD : GATE_INFERENCE;
}

/* t's data pointer, through t.data_ptr(). -1 with the exception set. */
static int data_ptr_of(PyObject *t, void **data) {
  PyObject *ptr = PyObject_CallMethodNoArgs(t, str_data_ptr);
  if (ptr == NULL) return -1;
  *data = PyLong_AsVoidPtr(ptr);
  Py_DECREF(ptr);
  return PyErr_Occurred() ? -1 : 0;
}

/* t from its data pointer and a tuple of strides; bhtd: the strides are of a [B, H, T, D] tensor,
 * passed to the library as its [B, T, H, D] (attn.h's strides, no copy). */
static int strided(attn_tensor *t, void *data, PyObject *strides, int bhtd) {
  memset(t, 0, sizeof *t);
  t->data = data;
  Py_ssize_t n = PyTuple_Check(strides) ? PyTuple_GET_SIZE(strides) : -1;
  if (n < 0 || n > ATTN_MAX_DIMS) {
    PyErr_SetString(PyExc_TypeError, "memo: strides must be a tuple of at most 4 integers");
    return -1;
  }
  for (Py_ssize_t d = 0; d < n; ++d) {
    Py_ssize_t from = bhtd && n == 4 && (d == 1 || d == 2) ? 3 - d : d;
    t->stride[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(strides, from));
    if (t->stride[d] == -1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

/* t as the library takes it: its data pointer and t.stride(). */
static int tensor_of(attn_tensor *t, PyObject *obj, int bhtd) {
  void *data;
  if (data_ptr_of(obj, &data) != 0) return -1;
  PyObject *strides = PyObject_CallMethodNoArgs(obj, str_stride);
  if (strides == NULL) return -1;
  int status = strided(t, data, strides, bhtd);
  Py_DECREF(strides);
  return status;
}

/* An output of the call: alloc is (callable, kwargs or None), called as callable(q, **kwargs). */
static PyObject *memo_alloc(PyObject *alloc, PyObject *q) {
  if (!PyTuple_Check(alloc) || PyTuple_GET_SIZE(alloc) != 2) {
    PyErr_SetString(PyExc_TypeError, "memo: an allocation is (callable, kwargs or None)");
    return NULL;
  }
  PyObject *kwargs = PyTuple_GET_ITEM(alloc, 1);
  PyObject *args = PyTuple_Pack(1, q);
  if (args == NULL) return NULL;
  PyObject *t = PyObject_Call(PyTuple_GET_ITEM(alloc, 0), args, kwargs == Py_None ? NULL : kwargs);
  Py_DECREF(args);
  return t;
}

/* What a run of an entry shares between the passes: the plan with its stream set, q, k, v and
 * the workspace of the pass (allocated; *ws holds it, or None). */
static attn_plan *memo_begin(PyObject *entry, PyObject *const *tensors, PyObject *key, int pass,
                             attn_inputs *in, int *bhtd, PyObject **ws, void **ws_ptr,
                             size_t *ws_size) {
  *ws = NULL;
  if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != ENTRY_SIZE) {
    PyErr_Format(PyExc_TypeError, "memo: an entry is a tuple of %d items", ENTRY_SIZE);
    return NULL;
  }
  attn_plan *plan = get_plan(PyTuple_GET_ITEM(entry, ENTRY_PLAN));
  *bhtd = PyObject_IsTrue(PyTuple_GET_ITEM(entry, ENTRY_BHTD));
  if (plan == NULL || *bhtd < 0) return NULL;
  attn_inputs_init(in);
  attn_tensor *qkv[MEMO_TENSORS] = {&in->q, &in->k, &in->v};
  for (int i = 0; i < MEMO_TENSORS; ++i) {
    void *data;
    if (data_ptr_of(tensors[i], &data) != 0 || strided(qkv[i], data, key_strides(key, i), *bhtd))
      return NULL;
  }
  PyObject *alloc = PyTuple_GET_ITEM(entry, pass == 0 ? ENTRY_FWD_WS : ENTRY_BWD_WS);
  *ws_ptr = NULL;
  *ws_size = 0;
  if (alloc != Py_None) {
    *ws_size = PyLong_AsSize_t(
        PyTuple_GET_ITEM(entry, pass == 0 ? ENTRY_FWD_WS_BYTES : ENTRY_BWD_WS_BYTES));
    if ((*ws_size == (size_t)-1 && PyErr_Occurred()) ||
        (*ws = memo_alloc(alloc, tensors[0])) == NULL || data_ptr_of(*ws, ws_ptr) != 0)
      return NULL;
  }
  PyObject *stream_fn = PyTuple_GET_ITEM(entry, ENTRY_STREAM);
  if (stream_fn != Py_None) {
    PyObject *stream = PyObject_CallOneArg(stream_fn, PyTuple_GET_ITEM(entry, ENTRY_STREAM_ARG));
    int failed = stream == NULL || set_stream(plan, stream) != 0;
    Py_XDECREF(stream);
    if (failed) return NULL;
  }
  return plan;
}

/* Runs an entry's forward: out, or (out, lse) when the entry returns lse or with_lse. */
static PyObject *memo_run(PyObject *entry, PyObject *const *tensors, PyObject *key, int with_lse) {
  attn_inputs in;
  int bhtd;
  PyObject *ws, *out = NULL, *lse = NULL, *result = NULL;
  void *ws_ptr;
  size_t ws_size;
  attn_plan *plan = memo_begin(entry, tensors, key, 0, &in, &bhtd, &ws, &ws_ptr, &ws_size);
  if (plan == NULL) goto done;
  int return_lse = PyObject_IsTrue(PyTuple_GET_ITEM(entry, ENTRY_RETURN_LSE));
  if (return_lse < 0) goto done;
  with_lse |= return_lse;
  attn_outputs outs;
  attn_outputs_init(&outs);
  if ((out = memo_alloc(PyTuple_GET_ITEM(entry, ENTRY_OUT), tensors[0])) == NULL ||
      tensor_of(&outs.out, out, bhtd) != 0)
    goto done;
  if (with_lse && ((lse = memo_alloc(PyTuple_GET_ITEM(entry, ENTRY_LSE), tensors[0])) == NULL ||
                   tensor_of(&outs.lse, lse, 0) != 0))
    goto done;
  attn_status status;
  PyThreadState *save = PyEval_SaveThread();
  status = attn_plan_forward(plan, &in, ws_ptr, ws_size, &outs);
  PyEval_RestoreThread(save);
  if (status != ATTN_STATUS_OK) {
    raise_plan_error(PyTuple_GET_ITEM(entry, ENTRY_PLAN), status);
  } else if (with_lse) {
    result = PyTuple_Pack(2, out, lse);
  } else {
    result = out;
    out = NULL;
  }
done:
  /* The workspace is dropped after the launch: PyTorch's caching allocator hands its memory to
   * later work on the same stream only, which runs after this call's kernels. */
  Py_XDECREF(ws);
  Py_XDECREF(out);
  Py_XDECREF(lse);
  return result;
}

/* memo_forward(memo, options, q, k, v) -> the call's result, or None: no entry for this call (or
 * the call may not take one: a guard up, another tensor type). */
static PyObject *ext_memo_forward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 + MEMO_TENSORS || !PyDict_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "memo_forward(memo: dict, options, q, k, v)");
    return NULL;
  }
  PyObject *const *tensors = args + 2;
  int gate = memo_gate(tensors);
  if (gate <= GATE_NO) {
    if (gate < 0) return NULL;
    Py_RETURN_NONE;
  }
  PyObject *key = memo_key_of(args[1], tensors);
  if (key == NULL) return NULL;
  PyObject *entry = PyDict_GetItemWithError(args[0], key); /* borrowed */
  PyObject *result = NULL;
  if (entry != NULL) {
    Py_INCREF(entry); /* a thread switch inside the run could drop it from the dict */
    if (gate == GATE_AUTOGRAD) {
      PyObject *call[] = {entry, key, tensors[0], tensors[1], tensors[2]};
      result = PyObject_Vectorcall(memo_autograd, call, 5, NULL);
    } else {
      result = memo_run(entry, tensors, key, 0);
    }
    Py_DECREF(entry);
  } else if (!PyErr_Occurred()) {
    result = Py_NewRef(Py_None);
  } else if (PyErr_ExceptionMatches(PyExc_TypeError)) { /* unhashable options: never kept */
    PyErr_Clear();
    result = Py_NewRef(Py_None);
  }
  Py_DECREF(key);
  return result;
}

/* memo_run(entry, key, q, k, v) -> (out, lse): the forward of the autograd hook. */
static PyObject *ext_memo_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 2 + MEMO_TENSORS || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "memo_run(entry, key, q, k, v)");
    return NULL;
  }
  return memo_run(args[0], args + 2, args[1], 1);
}

/* memo_backward(entry, key, q, k, v, out, lse, dout) -> (dq, dk, dv): the backward of the
 * autograd hook; the gradients are allocated like q, k, v. */
static PyObject *ext_memo_backward(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 5 + MEMO_TENSORS || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "memo_backward(entry, key, q, k, v, out, lse, dout)");
    return NULL;
  }
  PyObject *const *tensors = args + 2;
  attn_inputs in;
  int bhtd;
  PyObject *ws, *grads[MEMO_TENSORS] = {NULL, NULL, NULL}, *result = NULL;
  void *ws_ptr;
  size_t ws_size;
  attn_plan *plan = memo_begin(args[0], tensors, args[1], 1, &in, &bhtd, &ws, &ws_ptr, &ws_size);
  if (plan == NULL) goto done;
  attn_outputs fwd;
  attn_outputs_init(&fwd);
  attn_grads g;
  attn_grads_init(&g);
  attn_tensor dout;
  attn_tensor *dqkv[MEMO_TENSORS] = {&g.dq, &g.dk, &g.dv};
  if (tensor_of(&fwd.out, args[5], bhtd) != 0 || tensor_of(&fwd.lse, args[6], 0) != 0 ||
      tensor_of(&dout, args[7], bhtd) != 0)
    goto done;
  for (int i = 0; i < MEMO_TENSORS; ++i)
    if ((grads[i] = PyObject_CallOneArg(memo_empty_like, tensors[i])) == NULL ||
        tensor_of(dqkv[i], grads[i], bhtd) != 0)
      goto done;
  attn_status status;
  PyThreadState *save = PyEval_SaveThread();
  status = attn_plan_backward(plan, &in, &fwd, &dout, ws_ptr, ws_size, &g);
  PyEval_RestoreThread(save);
  if (status != ATTN_STATUS_OK)
    raise_plan_error(PyTuple_GET_ITEM(args[0], ENTRY_PLAN), status);
  else
    result = PyTuple_Pack(3, grads[0], grads[1], grads[2]);
done:
  Py_XDECREF(ws);
  for (int i = 0; i < MEMO_TENSORS; ++i) Py_XDECREF(grads[i]);
  return result;
}

/* memo_key(options, q, k, v): the key memo_forward looks up, for the front-end to add an entry. */
static PyObject *ext_memo_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs != 1 + MEMO_TENSORS) {
    PyErr_SetString(PyExc_TypeError, "memo_key(options, q, k, v)");
    return NULL;
  }
  return memo_key_of(args[0], args + 1);
}

/* ---- context: policy, cache, threads, last error ------------------------------------------- */

static PyObject *ext_last_error(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ctx_obj;
  if (!PyArg_ParseTuple(args, "O", &ctx_obj)) return NULL;
  attn_ctx *ctx = get_ctx(ctx_obj);
  if (ctx == NULL) return NULL;
  return PyUnicode_FromString(attn_ctx_last_error(ctx));
}

/* set_policy(ctx, allow_autotune, on_miss, tune_backward, warmup_iters, measure_iters,
 * max_seconds, persist, cache_path or None, deterministic) */
static PyObject *ext_set_policy(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ctx_obj;
  attn_policy pol;
  attn_policy_init(&pol);
  int allow, on_miss, tune_bwd, warmup, measure, persist, det;
  double max_seconds;
  const char *path = NULL;
  if (!PyArg_ParseTuple(args, "Oiiiiidizi", &ctx_obj, &allow, &on_miss, &tune_bwd, &warmup,
                        &measure, &max_seconds, &persist, &path, &det))
    return NULL;
  attn_ctx *ctx = get_ctx(ctx_obj);
  if (ctx == NULL) return NULL;
  pol.allow_autotune = allow;
  pol.on_miss = on_miss;
  pol.tune_backward = tune_bwd;
  pol.warmup_iters = warmup;
  pol.measure_iters = measure;
  pol.max_seconds = max_seconds;
  pol.persist = persist;
  pol.cache_path = path;
  pol.deterministic = det;
  attn_status status = attn_ctx_set_policy(ctx, &pol);
  if (status != ATTN_STATUS_OK) return raise_status(status, attn_ctx_last_error(ctx));
  Py_RETURN_NONE;
}

static PyObject *policy_tuple(const attn_policy *pol) {
  return Py_BuildValue("(iiiiidizi)", pol->allow_autotune, pol->on_miss, pol->tune_backward,
                       pol->warmup_iters, pol->measure_iters, pol->max_seconds, pol->persist,
                       pol->cache_path, pol->deterministic);
}

static PyObject *ext_get_policy(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ctx_obj = NULL;
  if (!PyArg_ParseTuple(args, "|O", &ctx_obj)) return NULL;
  attn_policy pol;
  if (ctx_obj == NULL) { /* the defaults, with the environment's say (ATTN_AUTOTUNE) */
    attn_policy_init(&pol);
    return policy_tuple(&pol);
  }
  attn_ctx *ctx = get_ctx(ctx_obj);
  if (ctx == NULL) return NULL;
  attn_status status = attn_ctx_get_policy(ctx, &pol);
  if (status != ATTN_STATUS_OK) return raise_status(status, attn_ctx_last_error(ctx));
  return policy_tuple(&pol);
}

/* cache(ctx, what, path): "path" -> str, "count" -> (memory, disk), "clear", "import", "export" */
static PyObject *ext_cache(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ctx_obj;
  const char *what, *path = NULL;
  if (!PyArg_ParseTuple(args, "Os|z", &ctx_obj, &what, &path)) return NULL;
  attn_ctx *ctx = get_ctx(ctx_obj);
  if (ctx == NULL) return NULL;
  attn_status status;
  if (strcmp(what, "path") == 0) {
    char buf[4096];
    status = attn_cache_get_path(ctx, buf, sizeof buf);
    if (status != ATTN_STATUS_OK) return raise_status(status, attn_ctx_last_error(ctx));
    return PyUnicode_FromString(buf);
  }
  if (strcmp(what, "count") == 0) {
    int64_t memory = 0, disk = 0;
    status = attn_cache_count(ctx, &memory, &disk);
    if (status != ATTN_STATUS_OK) return raise_status(status, attn_ctx_last_error(ctx));
    return Py_BuildValue("(LL)", (long long)memory, (long long)disk);
  }
  if (strcmp(what, "clear") == 0) {
    status = attn_cache_clear(ctx);
  } else if (strcmp(what, "import") == 0 && path != NULL) {
    status = attn_cache_import(ctx, path);
  } else if (strcmp(what, "export") == 0 && path != NULL) {
    status = attn_cache_export(ctx, path);
  } else {
    PyErr_Format(PyExc_ValueError, "cache: unknown request '%s' (or no path given)", what);
    return NULL;
  }
  if (status != ATTN_STATUS_OK) return raise_status(status, attn_ctx_last_error(ctx));
  Py_RETURN_NONE;
}

static PyObject *ext_set_num_threads(PyObject *self, PyObject *args) {
  (void)self;
  PyObject *ctx_obj;
  int n;
  if (!PyArg_ParseTuple(args, "Oi", &ctx_obj, &n)) return NULL;
  attn_ctx *ctx = get_ctx(ctx_obj);
  if (ctx == NULL) return NULL;
  attn_status status = attn_ctx_set_num_threads(ctx, n);
  if (status != ATTN_STATUS_OK) return raise_status(status, attn_ctx_last_error(ctx));
  Py_RETURN_NONE;
}

/* ---- the library: version and registry ------------------------------------------------------ */

static PyObject *ext_version(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  return PyUnicode_FromString(attn_version_string());
}

/* Appends item, a new reference (or NULL after a failed build), to list and drops it; on failure
 * drops the list too and returns -1 with the exception set. */
static int append_new(PyObject *list, PyObject *item) {
  if (item == NULL || PyList_Append(list, item) != 0) {
    Py_XDECREF(item);
    Py_DECREF(list);
    return -1;
  }
  Py_DECREF(item);
  return 0;
}

/* [(name, platform name, device, version)] of every registered implementation, in order. */
static PyObject *ext_registry(PyObject *self, PyObject *args) {
  (void)self;
  (void)args;
  int32_t n = attn_impl_count();
  PyObject *list = PyList_New(0);
  if (list == NULL) return NULL;
  for (int32_t i = 0; i < n; ++i) {
    int32_t device = attn_impl_device(i);
    PyObject *item =
        Py_BuildValue("(sssi)", attn_impl_name(i), attn_platform_name(attn_impl_platform(i)),
                      device == ATTN_DEVICE_CUDA ? "cuda" : "cpu", (int)attn_impl_version(i));
    if (append_new(list, item) != 0) return NULL;
  }
  return list;
}

/* The GPU modules: a list of {"name", "loaded", "path", "reason"} (attn_module_info). */
static PyObject *ext_modules(PyObject *self, PyObject *args) {
  (void)self, (void)args;
  PyObject *list = PyList_New(0);
  for (int32_t i = 0; list != NULL && i < attn_module_count(); ++i) {
    attn_module_status m;
    if (attn_module_info(i, &m) != ATTN_STATUS_OK) continue;
    PyObject *d = Py_BuildValue("{s:s,s:O,s:s,s:s}", "name", m.name, "loaded",
                                m.loaded ? Py_True : Py_False, "path", m.path, "reason", m.message);
    if (append_new(list, d) != 0) return NULL;
  }
  return list;
}

static PyMethodDef ext_methods[] = {
    {"ctx_new", ext_ctx_new, METH_NOARGS, "A new attn_ctx (capsule)."},
    {"problem_default", ext_problem_default, METH_NOARGS, "attn_problem_init's fields as a tuple."},
    {"problem_fields", ext_problem_fields, METH_NOARGS, "The names of a problem tuple's fields."},
    {"input_fields", ext_input_fields, METH_NOARGS, "The names of an inputs tuple's items."},
    {"problem_string", ext_problem_string, METH_VARARGS,
     "The canonical string of a problem tuple."},
    {"problem_parse", ext_problem_parse, METH_VARARGS, "A problem tuple from its string."},
    {"plan_new", ext_plan_new, METH_VARARGS, "attn_plan_create(ctx, problem, impl, config, ...)."},
    {"plan_info", ext_plan_info, METH_VARARGS, "(impl, config, fwd bytes, bwd bytes) of a plan."},
    {"forward", ext_forward, METH_VARARGS, "attn_plan_forward."},
    {"backward", ext_backward, METH_VARARGS, "attn_plan_backward."},
    {"bench_forward", ext_bench_forward, METH_VARARGS, "Seconds per attn_plan_forward from C."},
    {"memo_hooks", ext_memo_hooks, METH_VARARGS, "What the memo needs of the framework."},
    {"memo_forward", (PyCFunction)(void (*)(void))ext_memo_forward, METH_FASTCALL,
     "A repeated call's forward from the memo, or None."},
    {"memo_key", (PyCFunction)(void (*)(void))ext_memo_key, METH_FASTCALL,
     "The memo's key of (options, q, k, v)."},
    {"memo_run", (PyCFunction)(void (*)(void))ext_memo_run, METH_FASTCALL,
     "A memo entry's forward with lse: the autograd hook's forward."},
    {"memo_backward", (PyCFunction)(void (*)(void))ext_memo_backward, METH_FASTCALL,
     "A memo entry's backward: the autograd hook's backward."},
    {"last_error", ext_last_error, METH_VARARGS, "attn_ctx_last_error."},
    {"set_policy", ext_set_policy, METH_VARARGS, "attn_ctx_set_policy."},
    {"get_policy", ext_get_policy, METH_VARARGS, "attn_ctx_get_policy (defaults without ctx)."},
    {"cache", ext_cache, METH_VARARGS, "The executor's cache: path, count, clear, import, export."},
    {"set_num_threads", ext_set_num_threads, METH_VARARGS, "attn_ctx_set_num_threads."},
    {"version", ext_version, METH_NOARGS, "attn_version_string."},
    {"registry", ext_registry, METH_NOARGS, "The registered implementations."},
    {"modules", ext_modules, METH_NOARGS, "The GPU modules, loaded or not, and why."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef ext_module = {PyModuleDef_HEAD_INIT,
                                        "_ext",
                                        "libattn's binding over attn.h (private).",
                                        -1,
                                        ext_methods,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL};

PyMODINIT_FUNC PyInit__ext(void) {
  PyObject *m = PyModule_Create(&ext_module);
  if (m == NULL) return NULL;
  if ((str_shape = PyUnicode_InternFromString("shape")) == NULL ||
      (str_stride = PyUnicode_InternFromString("stride")) == NULL ||
      (str_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
      (str_device = PyUnicode_InternFromString("device")) == NULL ||
      (str_data_ptr = PyUnicode_InternFromString("data_ptr")) == NULL ||
      (str_requires_grad = PyUnicode_InternFromString("requires_grad")) == NULL) {
    Py_DECREF(m);
    return NULL;
  }
  attn_error_type = PyErr_NewExceptionWithDoc(
      "libattn.Error", "A libattn call failed; the message names the argument and the rule.",
      PyExc_RuntimeError, NULL);
  PyObject *bases = attn_error_type ? PyTuple_Pack(2, attn_error_type, PyExc_ValueError) : NULL;
  invalid_arg_type =
      bases ? PyErr_NewExceptionWithDoc("libattn.InvalidArgument",
                                        "An argument broke a rule of attn.h (also a ValueError).",
                                        bases, NULL)
            : NULL;
  Py_XDECREF(bases);
  unsupported_type = attn_error_type
                         ? PyErr_NewExceptionWithDoc(
                               "libattn.Unsupported",
                               "No implementation (or not the one asked for) can run the problem.",
                               attn_error_type, NULL)
                         : NULL;
  if (attn_error_type == NULL || invalid_arg_type == NULL || unsupported_type == NULL ||
      PyModule_AddObjectRef(m, "Error", attn_error_type) != 0 ||
      PyModule_AddObjectRef(m, "InvalidArgument", invalid_arg_type) != 0 ||
      PyModule_AddObjectRef(m, "Unsupported", unsupported_type) != 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
