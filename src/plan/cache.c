/*
 * src/plan/cache.c - the configuration cache: in-memory tables and the persistent file ("wisdom").
 *
 * The file is text: the header line "libattn-cache 1", optional "#" comment lines, then one entry
 * per line of nine tab-separated fields
 *   fingerprint  candidates  pass  threads  problem  impl  impl_version  config  time_us
 * where the first five are the key (select.c builds it). Only measured results are written.
 *
 * Why it is safe to share between processes (ejKernel's cache has neither property):
 *   - a writer holds an advisory fcntl lock on "<path>.lock" (a separate file, because the cache
 *     file itself is replaced by rename and a lock on the old inode would protect nothing), re-reads
 *     the file under the lock and merges its entries into the current content, so concurrent
 *     writers never lose each other's entries; threads of one process are serialised by a mutex
 *     because fcntl locks are per process;
 *   - it writes "<path>.tmp", fsyncs it, and renames it over the file, so a reader sees the old or
 *     the new file, never a torn one, even if the writer is killed at any point.
 * A reader takes no lock: rename makes every file it can open complete.
 *
 * A file that is not ours (first line not "libattn-cache <n>") or of another format version is
 * ignored with a message and never overwritten; malformed or truncated lines are skipped with a
 * message, and dropped by the next write.
 */
#define _GNU_SOURCE
#include "plan/exec.h"

#include "core/ctx.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ATTN_CACHE_MAGIC "libattn-cache"
#define ATTN_CACHE_FORMAT 1
#define ATTN_CACHE_FIELDS 9

/* ---- tables ---------------------------------------------------------------------------------- */

const attn_cache_entry *attn_cache_table_find(const attn_cache_table *t, const char *key) {
  for (int64_t i = 0; i < t->count; ++i)
    if (strcmp(t->items[i].key, key) == 0) return &t->items[i];
  return NULL;
}

int attn_cache_table_put(attn_cache_table *t, const attn_cache_entry *e) {
  char *key = strdup(e->key);
  if (key == NULL) return 0;
  for (int64_t i = 0; i < t->count; ++i) {
    if (strcmp(t->items[i].key, e->key) == 0) {
      free(t->items[i].key);
      t->items[i] = *e;
      t->items[i].key = key;
      return 1;
    }
  }
  if (t->count == t->capacity) {
    int64_t cap = t->capacity ? 2 * t->capacity : 16;
    attn_cache_entry *items = realloc(t->items, (size_t)cap * sizeof *items);
    if (items == NULL) {
      free(key);
      return 0;
    }
    t->items = items;
    t->capacity = cap;
  }
  t->items[t->count] = *e;
  t->items[t->count].key = key;
  ++t->count;
  return 1;
}

void attn_cache_table_free(attn_cache_table *t) {
  for (int64_t i = 0; i < t->count; ++i) free(t->items[i].key);
  free(t->items);
  memset(t, 0, sizeof *t);
}

/* ---- reading --------------------------------------------------------------------------------- */

/* Splits one line (modified in place) into exactly ATTN_CACHE_FIELDS tab-separated fields. */
static int split_fields(char *line, char *fields[ATTN_CACHE_FIELDS]) {
  int n = 0;
  char *s = line;
  for (;;) {
    if (n == ATTN_CACHE_FIELDS) return 0;
    fields[n++] = s;
    char *tab = strchr(s, '\t');
    if (tab == NULL) break;
    *tab = '\0';
    s = tab + 1;
  }
  return n == ATTN_CACHE_FIELDS;
}

/* One entry line into e (its key pointing into line); 0 when malformed. */
static int parse_entry(char *line, attn_cache_entry *e, char *key_buf, size_t key_size) {
  char *f[ATTN_CACHE_FIELDS];
  if (!split_fields(line, f)) return 0;
  for (int i = 0; i < ATTN_CACHE_FIELDS; ++i)
    if (f[i][0] == '\0') return 0;
  int n = snprintf(key_buf, key_size, "%s\t%s\t%s\t%s\t%s", f[0], f[1], f[2], f[3], f[4]);
  if (n < 0 || (size_t)n >= key_size) return 0;
  if (strlen(f[5]) >= sizeof e->impl || strlen(f[7]) >= sizeof e->config) return 0;
  char *end;
  errno = 0;
  long version = strtol(f[6], &end, 10);
  if (errno != 0 || *end != '\0' || version < 0 || version > INT32_MAX) return 0;
  double us = strtod(f[8], &end);
  if (*end != '\0' || !(us >= 0.0) || us > 1e300) return 0;
  e->key = key_buf;
  snprintf(e->impl, sizeof e->impl, "%s", f[5]);
  e->impl_version = (int32_t)version;
  snprintf(e->config, sizeof e->config, "%s", f[7]);
  e->time_us = us;
  return 1;
}

/* Reads a whole open file into a NUL-terminated buffer. */
static char *read_all(int fd, size_t *size) {
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap + 1);
  if (buf == NULL) return NULL;
  for (;;) {
    if (len == cap) {
      char *more = realloc(buf, 2 * cap + 1);
      if (more == NULL) {
        free(buf);
        return NULL;
      }
      buf = more;
      cap *= 2;
    }
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      free(buf);
      return NULL;
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  buf[len] = '\0';
  *size = len;
  return buf;
}

/* Parses the text of a cache file into t. */
static attn_status parse_file(attn_ctx *ctx, const char *path, char *text, size_t size,
                              attn_cache_table *t) {
  char msg[ATTN_MESSAGE_SIZE];
  if (size == 0) return ATTN_STATUS_OK; /* an empty file is an empty cache */
  if (memchr(text, '\0', size) != NULL) {
    attn_format(msg, sizeof msg,
                "cache file %s holds NUL bytes: it is corrupt or not a libattn "
                "cache; ignoring it",
                path);
    attn_exec_report_failure(ctx, ATTN_STATUS_INVALID_ARGUMENT, msg);
    return ATTN_STATUS_INVALID_ARGUMENT;
  }
  char *line = text;
  char *nl = strchr(line, '\n');
  if (nl != NULL) *nl = '\0';
  int format = 0;
  char extra = 0;
  if (sscanf(line, ATTN_CACHE_MAGIC " %d%c", &format, &extra) != 1 ||
      strncmp(line, ATTN_CACHE_MAGIC " ", sizeof ATTN_CACHE_MAGIC) != 0) {
    attn_format(msg, sizeof msg,
                "cache file %s: first line is not \"" ATTN_CACHE_MAGIC " %d\": it "
                "is corrupt or not a libattn cache; ignoring it",
                path, ATTN_CACHE_FORMAT);
    attn_exec_report_failure(ctx, ATTN_STATUS_INVALID_ARGUMENT, msg);
    return ATTN_STATUS_INVALID_ARGUMENT;
  }
  if (format != ATTN_CACHE_FORMAT) {
    attn_format(msg, sizeof msg,
                "cache file %s has format version %d, this library reads version "
                "%d; ignoring it",
                path, format, ATTN_CACHE_FORMAT);
    attn_exec_report_failure(ctx, ATTN_STATUS_INVALID_ARGUMENT, msg);
    return ATTN_STATUS_INVALID_ARGUMENT;
  }
  int64_t number = 1, bad = 0, first_bad = 0;
  char key[ATTN_KEY_SIZE];
  while (nl != NULL) {
    line = nl + 1;
    ++number;
    nl = strchr(line, '\n');
    if (nl == NULL) {
      /* Every line we write ends in '\n': text after the last one is a torn line. */
      if (*line != '\0') {
        if (bad++ == 0) first_bad = number;
      }
      break;
    }
    *nl = '\0';
    if (line[0] == '\0' || line[0] == '#') continue;
    attn_cache_entry e;
    if (!parse_entry(line, &e, key, sizeof key)) {
      if (bad++ == 0) first_bad = number;
      continue;
    }
    if (!attn_cache_table_put(t, &e)) return ATTN_STATUS_OUT_OF_MEMORY;
  }
  if (bad > 0) {
    attn_format(msg, sizeof msg,
                "cache file %s: %lld malformed or truncated line(s), the first at "
                "line %lld; skipping them",
                path, (long long)bad, (long long)first_bad);
    attn_exec_report_failure(ctx, ATTN_STATUS_OK, msg);
  }
  return ATTN_STATUS_OK;
}

/* Reads path (already open as fd) into t. */
static attn_status read_fd(attn_ctx *ctx, const char *path, int fd, attn_cache_table *t) {
  size_t size = 0;
  char *text = read_all(fd, &size);
  if (text == NULL) {
    char msg[ATTN_MESSAGE_SIZE];
    attn_format(msg, sizeof msg, "cache file %s cannot be read (%s); ignoring it", path,
                strerror(errno));
    attn_exec_report_failure(ctx, ATTN_STATUS_IO_ERROR, msg);
    return ATTN_STATUS_IO_ERROR;
  }
  attn_status status = parse_file(ctx, path, text, size, t);
  free(text);
  return status;
}

attn_status attn_cache_read(attn_ctx *ctx, const char *path, int must_exist, attn_cache_table *t) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT && !must_exist) return ATTN_STATUS_OK;
    char msg[ATTN_MESSAGE_SIZE];
    attn_format(msg, sizeof msg, "cache file %s cannot be opened (%s)", path, strerror(errno));
    attn_exec_report_failure(ctx, ATTN_STATUS_IO_ERROR, msg);
    return ATTN_STATUS_IO_ERROR;
  }
  attn_status status = read_fd(ctx, path, fd, t);
  close(fd);
  return status;
}

static int64_t mtime_ns(const struct stat *st) {
  return (int64_t)st->st_mtim.tv_sec * 1000000000 + (int64_t)st->st_mtim.tv_nsec;
}

attn_status attn_cache_file_refresh(attn_ctx *ctx, attn_cache_file *f, const char *path) {
  int same_path = f->path != NULL && strcmp(f->path, path) == 0;
  struct stat st;
  if (stat(path, &st) != 0) {
    attn_cache_table_free(&f->table);
    f->exists = 0;
    if (!same_path) {
      free(f->path);
      f->path = strdup(path);
    }
    if (errno == ENOENT || errno == ENOTDIR) return ATTN_STATUS_OK;
    return ATTN_STATUS_IO_ERROR;
  }
  if (same_path && f->exists && f->mtime_ns == mtime_ns(&st) && f->size == (int64_t)st.st_size &&
      f->inode == (int64_t)st.st_ino && f->dev == (int64_t)st.st_dev)
    return ATTN_STATUS_OK; /* unchanged since the last read */
  attn_cache_table_free(&f->table);
  free(f->path);
  f->path = strdup(path);
  if (f->path == NULL) return ATTN_STATUS_OUT_OF_MEMORY;
  /* Remember the identity even when the file is bad, so it is reported once, not at every plan. */
  f->exists = 1;
  f->mtime_ns = mtime_ns(&st);
  f->size = (int64_t)st.st_size;
  f->inode = (int64_t)st.st_ino;
  f->dev = (int64_t)st.st_dev;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    char msg[ATTN_MESSAGE_SIZE];
    attn_format(msg, sizeof msg, "cache file %s cannot be opened (%s); ignoring it", path,
                strerror(errno));
    attn_exec_report_failure(ctx, ATTN_STATUS_IO_ERROR, msg);
    return ATTN_STATUS_IO_ERROR;
  }
  /* The file read is the one stat saw unless a writer renamed a new one in between; then the next
   * refresh sees a changed identity and reads again. */
  struct stat st2;
  if (fstat(fd, &st2) == 0) {
    f->mtime_ns = mtime_ns(&st2);
    f->size = (int64_t)st2.st_size;
    f->inode = (int64_t)st2.st_ino;
    f->dev = (int64_t)st2.st_dev;
  }
  attn_status status = read_fd(ctx, path, fd, &f->table);
  close(fd);
  if (status != ATTN_STATUS_OK) attn_cache_table_free(&f->table);
  return status;
}

void attn_cache_file_free(attn_cache_file *f) {
  attn_cache_table_free(&f->table);
  free(f->path);
  memset(f, 0, sizeof *f);
}

/* ---- writing --------------------------------------------------------------------------------- */

static pthread_mutex_t write_mutex = PTHREAD_MUTEX_INITIALIZER;
static void (*write_hook)(const char *stage) = NULL;

void attn_cache_set_write_hook_for_testing(void (*hook)(const char *stage)) { write_hook = hook; }

/* mkdir -p of the folder holding path. */
static int make_parent_dirs(const char *path) {
  char dir[PATH_MAX];
  if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return 0;
  char *slash = strrchr(dir, '/');
  if (slash == NULL || slash == dir) return 1;
  *slash = '\0';
  for (char *p = dir + 1; *p; ++p) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return 0;
    *p = '/';
  }
  return mkdir(dir, 0755) == 0 || errno == EEXIST;
}

static int write_full(int fd, const char *data, size_t size) {
  while (size > 0) {
    ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;
    data += n;
    size -= (size_t)n;
  }
  return 1;
}

/* The whole file's text for a table. NULL when out of memory. */
static char *format_table(const attn_cache_table *t, size_t *size) {
  size_t cap = 256, len = 0;
  for (int64_t i = 0; i < t->count; ++i)
    cap += strlen(t->items[i].key) + strlen(t->items[i].impl) + strlen(t->items[i].config) + 64;
  char *buf = malloc(cap);
  if (buf == NULL) return NULL;
  len += (size_t)snprintf(buf + len, cap - len,
                          ATTN_CACHE_MAGIC " %d\n# fingerprint\tcandidates\tpass\tthreads\tproblem"
                                           "\timpl\timpl_version\tconfig\ttime_us\n",
                          ATTN_CACHE_FORMAT);
  for (int64_t i = 0; i < t->count; ++i) {
    const attn_cache_entry *e = &t->items[i];
    len += (size_t)snprintf(buf + len, cap - len, "%s\t%s\t%d\t%s\t%.6g\n", e->key, e->impl,
                            (int)e->impl_version, e->config, e->time_us);
  }
  *size = len;
  return buf;
}

static attn_status write_failed(attn_ctx *ctx, const char *path, const char *what) {
  char msg[ATTN_MESSAGE_SIZE];
  attn_format(msg, sizeof msg, "cache file %s: %s (%s); measured results are kept in memory only",
              path, what, strerror(errno));
  attn_exec_report_failure(ctx, ATTN_STATUS_IO_ERROR, msg);
  return attn_fail(ctx, ATTN_STATUS_IO_ERROR, "%s", msg);
}

/* Under both locks: re-read, merge, write the temporary file, rename it over the file. */
static attn_status write_locked(attn_ctx *ctx, const char *path, const attn_cache_table *t) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
    errno = ENAMETOOLONG;
    return write_failed(ctx, path, "path is too long");
  }
  attn_cache_table merged = {0};
  attn_status status = attn_cache_read(ctx, path, 0, &merged);
  if (status == ATTN_STATUS_INVALID_ARGUMENT) {
    attn_cache_table_free(&merged);
    char msg[ATTN_MESSAGE_SIZE];
    attn_format(msg, sizeof msg,
                "cache file %s is not a libattn cache of format %d: not "
                "overwriting it; measured results are kept in memory only",
                path, ATTN_CACHE_FORMAT);
    attn_exec_report_failure(ctx, ATTN_STATUS_IO_ERROR, msg);
    return attn_fail(ctx, ATTN_STATUS_IO_ERROR, "%s", msg);
  }
  if (status != ATTN_STATUS_OK) {
    attn_cache_table_free(&merged);
    return write_failed(ctx, path, "cannot be read back to merge");
  }
  for (int64_t i = 0; i < t->count; ++i)
    if (!attn_cache_table_put(&merged, &t->items[i])) {
      attn_cache_table_free(&merged);
      return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory merging the cache");
    }
  size_t size = 0;
  char *text = format_table(&merged, &size);
  attn_cache_table_free(&merged);
  if (text == NULL)
    return attn_fail(ctx, ATTN_STATUS_OUT_OF_MEMORY, "out of memory writing the cache");
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    free(text);
    return write_failed(ctx, tmp, "cannot be created");
  }
  int ok = write_full(fd, text, size) && fsync(fd) == 0;
  free(text);
  if (close(fd) != 0) ok = 0;
  if (!ok) {
    unlink(tmp);
    return write_failed(ctx, tmp, "cannot be written");
  }
  if (write_hook != NULL) write_hook("tmp-written");
  if (rename(tmp, path) != 0) {
    unlink(tmp);
    return write_failed(ctx, path, "cannot be replaced");
  }
  /* Make the rename itself durable; best effort (some file systems refuse fsync on folders). */
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash != NULL) {
    if (slash == dir)
      slash[1] = '\0';
    else
      *slash = '\0';
  } else {
    snprintf(dir, sizeof dir, ".");
  }
  int dfd = open(dir, O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  return ATTN_STATUS_OK;
}

attn_status attn_cache_write(attn_ctx *ctx, const char *path, const attn_cache_table *t) {
  char lock_path[PATH_MAX];
  if (snprintf(lock_path, sizeof lock_path, "%s.lock", path) >= (int)sizeof lock_path) {
    errno = ENAMETOOLONG;
    return write_failed(ctx, path, "path is too long");
  }
  if (!make_parent_dirs(path)) return write_failed(ctx, path, "its folder cannot be created");
  pthread_mutex_lock(&write_mutex);
  attn_status status;
  int lock_fd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    status = write_failed(ctx, lock_path, "lock file cannot be opened");
  } else {
    struct flock lk;
    memset(&lk, 0, sizeof lk);
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    int rc;
    do rc = fcntl(lock_fd, F_SETLKW, &lk);
    while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      status = write_failed(ctx, lock_path, "lock cannot be taken");
    } else {
      status = write_locked(ctx, path, t);
      lk.l_type = F_UNLCK;
      (void)fcntl(lock_fd, F_SETLK, &lk);
    }
    close(lock_fd);
  }
  pthread_mutex_unlock(&write_mutex);
  return status;
}
