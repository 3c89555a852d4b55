/* Hugging Face import (common/formats/hf.h): config.json read by the family that its model_type
 * names, every tensor name and shape (from the family's tensor table) checked before any data is
 * read, units filled one at a time (transposed tensors turned), and the pieces the export
 * shares. */
#include "common/formats/hf.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/formats/safetensors.h"

/* config.json is a few kB; a bound keeps a wrong file (a checkpoint renamed) out of memory. */
#define HF_MAX_JSON (16u << 20)

void fy_hf_tensors(const struct fy_model_config *c, unsigned unit, const char *prefix,
                       struct fy_hf_tensors *out)
{
    out->n = fy_unit_tensors(c, unit, out->t);
    for (unsigned k = 0; k < out->n; k++) {
        char bare[FY_HF_NAME_MAX];
        fy_tensor_hf_name(c, unit, &out->t[k], bare, sizeof bare);
        snprintf(out->name[k], sizeof out->name[k], "%s%s", prefix, bare);
    }
}

/* dst[o][i] = src[i][o] for src [rows = in][cols = out]; blocked so both sides stay in cache. */
void fy_hf_transpose(float *dst, const float *src, size_t rows, size_t cols)
{
    const size_t B = 32;
    for (size_t i0 = 0; i0 < rows; i0 += B)
        for (size_t o0 = 0; o0 < cols; o0 += B) {
            size_t i1 = i0 + B < rows ? i0 + B : rows, o1 = o0 + B < cols ? o0 + B : cols;
            for (size_t o = o0; o < o1; o++)
                for (size_t i = i0; i < i1; i++)
                    dst[o * rows + i] = src[i * cols + o];
        }
}

void fy_hf_format_shape(char *buf, size_t len, int ndim, const uint64_t *shape)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%llu", d ? ", " : "", (unsigned long long)shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

/* Reads a whole small file (config.json, source.json) into a NUL-terminated buffer. */
int fy_hf_slurp(const char *path, char **out, size_t *len)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        fy_error("cannot open %s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    int rc = fstat(fd, &st) == 0 ? 0 : -errno;
    if (rc == 0 && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > HF_MAX_JSON))
        rc = -EINVAL;
    char *buf = rc == 0 ? malloc((size_t)st.st_size + 1) : NULL;
    if (rc == 0 && buf == NULL)
        rc = -ENOMEM;
    size_t done = 0;
    while (rc == 0 && done < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + done, (size_t)st.st_size - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            rc = n < 0 ? -errno : -EIO;
        else
            done += (size_t)n;
    }
    close(fd);
    if (rc < 0) {
        free(buf);
        if (rc == -EINVAL)
            fy_error("%s is not a regular file of at most %u MiB: is it a config file?", path,
                     HF_MAX_JSON >> 20);
        else
            fy_error("cannot read %s: %s", path, strerror(-rc));
        return rc;
    }
    buf[done] = 0;
    *out = buf;
    *len = done;
    return 0;
}

int fy_hf_parse_json(const char *path, const char *text, size_t len, cJSON **out)
{
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (*out == NULL || !cJSON_IsObject(*out)) {
        size_t at = end != NULL && end >= text ? (size_t)(end - text) : 0;
        cJSON_Delete(*out);
        *out = NULL;
        fy_error("%s: not a JSON object (malformed near byte %zu)", path, at);
        return -EINVAL;
    }
    return 0;
}

/* The family that config.json's model_type names, then its reader, then the config's checks. */
static int config_from_json(const char *path, const cJSON *root, struct fy_model_config *m)
{
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    const char *type = cJSON_IsString(mt) ? mt->valuestring : NULL;
    const struct fy_arch *a = fy_arch_by_hf_model_type(type);
    if (a == NULL) {
        const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
        const cJSON *a0 = cJSON_IsArray(arch) ? cJSON_GetArrayItem(arch, 0) : NULL;
        const char *first = cJSON_IsString(a0) ? a0->valuestring : NULL;
        char names[128];
        fy_arch_names(names, sizeof names, 1);
        fy_error("%s: model_type \"%s\"%s%s%s is not supported: this importer takes the model "
                 "types %s", path, type ? type : "(missing)", first ? " (architecture " : "",
                 first ? first : "", first ? ")" : "", names);
        return -EINVAL;
    }
    FY_TRY(a->hf_config_read(path, root, m));
    return fy_model_config_validate(m);
}

/* Dropout that config.json asks for, said: the backends train without it (the step is a function of
 * the weights and the batch alone, which the tests and the restarts rely on), so a fine-tuning run
 * here does not drop activations as transformers' Trainer would with this config; inference and
 * the export are unaffected. */
static void say_dropout(const char *path, const cJSON *root)
{
    static const char *const keys[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop",
                                       "attention_dropout", "hidden_dropout", "dropout"};
    char said[256] = "";
    size_t n = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        if (cJSON_IsNumber(v) && v->valuedouble > 0 && n < sizeof said)
            n += (size_t)snprintf(said + n, sizeof said - n, "%s\"%s\" %g", n ? ", " : "",
                                  keys[i], v->valuedouble);
    }
    if (said[0])
        fy_warn("%s: %s: training here runs without dropout, unlike transformers' Trainer with "
                "this config (inference and the export are the same); imported anyway",
                path, said);
}

int fy_hf_read_config(const char *path, struct fy_model_config *model)
{
    char *text;
    size_t len;
    FY_TRY(fy_hf_slurp(path, &text, &len));
    cJSON *root;
    int rc = fy_hf_parse_json(path, text, len, &root);
    free(text);
    if (rc == 0)
        rc = config_from_json(path, root, model);
    cJSON_Delete(root);
    return rc;
}

/* The same family and fields: the config hash covers them all. */
int fy_hf_same_model(const struct fy_model_config *a, const struct fy_model_config *b)
{
    return fy_model_arch(a) == fy_model_arch(b) && fy_model_config_hash(a) == fy_model_config_hash(b);
}

/* Removes the plain files of a directory made here, then the directory; quiet (cleanup). */
void fy_hf_remove_dir_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
                unlinkat(dirfd(d), e->d_name, 0);
        closedir(d);
    }
    rmdir(dir);
}

/* A new empty directory beside path ("path.tmp-XXXXXX") on the same filesystem. */
int fy_hf_make_temp_dir(const char *path, char *out, size_t len)
{
    int n = snprintf(out, len, "%s.tmp-XXXXXX", path);
    FY_REQUIRE(n > 0 && (size_t)n < len, -ENAMETOOLONG, "path too long: %.200s", path);
    if (mkdtemp(out) == NULL) {
        int e = errno;
        out[0] = 0;
        fy_error("cannot create a temporary directory beside %s: %s", path, strerror(e));
        return -e;
    }
    /* mkdtemp makes it 0700; the result should have the mode any new directory gets here */
    mode_t mask = umask(0);
    umask(mask);
    if (chmod(out, 0777 & ~mask) != 0) {
        int e = errno;
        rmdir(out);
        fy_error("cannot set the mode of %s: %s", out, strerror(e));
        out[0] = 0;
        return -e;
    }
    return 0;
}

/* Creates dir/name with text, fsynced. */
int fy_hf_write_file(const char *dir, const char *name, const char *text, size_t len)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    FY_SYS(fd, "cannot create %s", path);
    int rc = fy_write_all(fd, text, len, path, 0);
    if (rc == 0 && fsync(fd) != 0) {
        rc = -errno;
        fy_error("fsync of %s: %s", path, strerror(-rc));
    }
    if (close(fd) != 0 && rc == 0) {
        rc = -errno;
        fy_error("close of %s: %s", path, strerror(-rc));
    }
    return rc;
}

/* ---- import ---- */

/* Files of a model directory that travel with it unchanged, byte for byte: kept in the run at
 * import (beside config.json) and written into every export, so the export is a drop-in directory
 * with the model's own generation settings and tokenizer. */
static const char *const carried_names[] = {
    FY_HF_GENERATION_NAME, "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
    "added_tokens.json", "chat_template.jinja"};
#define CARRIED_COUNT (sizeof carried_names / sizeof carried_names[0])
_Static_assert(CARRIED_COUNT == FY_HF_CARRIED_COUNT, "the carried files and their count");


int fy_hf_carried_load(const char *dir, struct fy_hf_carried *c)
{
    for (size_t i = 0; i < CARRIED_COUNT; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dir, carried_names[i]);
        if (access(path, F_OK) == 0)
            FY_TRY(fy_hf_slurp(path, &c->text[i], &c->len[i]));
    }
    return 0;
}

int fy_hf_carried_write(const char *dir, const struct fy_hf_carried *c)
{
    for (size_t i = 0; i < CARRIED_COUNT; i++)
        if (c->text[i] != NULL)
            FY_TRY(fy_hf_write_file(dir, carried_names[i], c->text[i], c->len[i]));
    return 0;
}

int fy_hf_carried_has(const struct fy_hf_carried *c, const char *name)
{
    for (size_t i = 0; i < CARRIED_COUNT; i++)
        if (c->text[i] != NULL && strcmp(name, carried_names[i]) == 0)
            return 1;
    return 0;
}

void fy_hf_carried_free(struct fy_hf_carried *c)
{
    for (size_t i = 0; i < CARRIED_COUNT; i++) {
        free(c->text[i]);
        c->text[i] = NULL;
    }
}

struct fy_hf_src {
    char dir[PATH_MAX];
    char ckpt[PATH_MAX];   /* the single file or the index */
    char config[PATH_MAX]; /* DIR/config.json */
    char *config_text;     /* its bytes, copied into the run at save_source */
    size_t config_len;
    struct fy_hf_carried carried; /* generation config and tokenizer files, copied too */
    struct fy_model_config model;
    struct fy_st_reader *reader;
    char prefix[16];
    const struct fy_st_tensor *lm_head; /* NULL when not stored */
    int dtype;                          /* of every parameter, or 0: mixed */
    float *buf;                         /* one tensor: a Conv1D weight or lm_head.weight */
    size_t buf_n;
};

const struct fy_model_config *fy_hf_model(const struct fy_hf_src *s) { return &s->model; }
const char *fy_hf_path(const struct fy_hf_src *s) { return s->ckpt; }
const char *fy_hf_dtype(const struct fy_hf_src *s)
{
    return s->dtype ? fy_st_dtype_name(s->dtype) : "mixed";
}

/* Checks one expected parameter: present, with its shape. */
static int check_param(struct fy_hf_src *s, const struct fy_tensor_spec *p, const char *full)
{
    const struct fy_st_tensor *t = fy_st_find(s->reader, full);
    FY_REQUIRE(t != NULL, -EINVAL,
               "%s: tensor %s is missing (%s asks for %u layers, %u wide)", s->ckpt, full,
               s->config, s->model.n_layer, s->model.n_embd);
    int ok = t->ndim == p->ndim;
    for (int d = 0; ok && d < p->ndim; d++)
        ok = t->shape[d] == p->shape[d];
    if (!ok) {
        char have[96], want[96];
        fy_hf_format_shape(have, sizeof have, t->ndim, t->shape);
        fy_hf_format_shape(want, sizeof want, p->ndim, p->shape);
        fy_error("%s: tensor %s has shape %s, but %s (n_embd %u, vocab_size %u, n_positions %u) "
                 "needs %s",
                 t->file, full, have, s->config, s->model.n_embd, s->model.vocab, s->model.ctx,
                 want);
        return -EINVAL;
    }
    if (s->dtype == -1)
        s->dtype = t->dtype;
    else if (s->dtype != t->dtype)
        s->dtype = 0;
    if (p->transposed && fy_tensor_numel(p) > s->buf_n)
        s->buf_n = fy_tensor_numel(p);
    return 0;
}

/* Every tensor of the checkpoint is a parameter, a mask buffer, or lm_head.weight. */
static int check_extra(struct fy_hf_src *s)
{
    size_t plen = strlen(s->prefix);
    for (size_t i = 0; i < fy_st_count(s->reader); i++) {
        const struct fy_st_tensor *t = fy_st_tensor_at(s->reader, i);
        if (strcmp(t->name, "lm_head.weight") == 0 &&
            fy_model_arch(&s->model)->head_tied(&s->model)) {
            uint64_t want[2] = {s->model.vocab, s->model.n_embd};
            if (t->ndim != 2 || t->shape[0] != want[0] || t->shape[1] != want[1]) {
                char have[96], need[96];
                fy_hf_format_shape(have, sizeof have, t->ndim, t->shape);
                fy_hf_format_shape(need, sizeof need, 2, want);
                fy_error("%s: tensor lm_head.weight has shape %s, but %s needs %s (tied to wte)",
                         t->file, have, s->config, need);
                return -EINVAL;
            }
            s->lm_head = t;
            if ((uint64_t)s->model.vocab * s->model.n_embd > s->buf_n)
                s->buf_n = (size_t)s->model.vocab * s->model.n_embd;
            continue;
        }
        int known = strncmp(t->name, s->prefix, plen) == 0;
        const char *rest = t->name + plen;
        if (known && !fy_model_arch(&s->model)->hf_is_buffer(&s->model, rest)) {
            /* A parameter name: then it was checked by check_param, unless it is out of range. */
            known = 0;
            struct fy_hf_tensors p;
            for (unsigned u = 0; !known && u < fy_model_unit_count(&s->model); u++) {
                fy_hf_tensors(&s->model, u, "", &p);
                for (unsigned k = 0; !known && k < p.n; k++)
                    known = strcmp(rest, p.name[k]) == 0;
            }
        }
        FY_REQUIRE(known, -EINVAL,
                   "%s: tensor %s is not a parameter of the %s that %s describes (%u layers): "
                   "another architecture or a model with extra heads",
                   t->file, t->name, fy_model_arch(&s->model)->label, s->config,
                   s->model.n_layer);
    }
    return 0;
}

static int find_checkpoint(struct fy_hf_src *s)
{
    snprintf(s->ckpt, sizeof s->ckpt, "%s/%s", s->dir, FY_ST_INDEX_NAME);
    if (access(s->ckpt, F_OK) == 0)
        return 0;
    snprintf(s->ckpt, sizeof s->ckpt, "%s/%s", s->dir, FY_ST_SINGLE_NAME);
    if (access(s->ckpt, F_OK) == 0)
        return 0;
    char bin[PATH_MAX];
    snprintf(bin, sizeof bin, "%s/pytorch_model.bin", s->dir);
    fy_error("%s: no %s or %s%s", s->dir, FY_ST_SINGLE_NAME, FY_ST_INDEX_NAME,
             access(bin, F_OK) == 0
                 ? " (only pytorch_model.bin: save the model with safe_serialization=True)"
                 : ": give a Hugging Face model directory");
    return -ENOENT;
}

/* The prefix the checkpoint puts before its names: the family's (GPT-2: "transformer."), or none;
 * told by where the first tensor of unit 0 is. */
static int find_prefix(struct fy_hf_src *s)
{
    const struct fy_arch *a = fy_model_arch(&s->model);
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    fy_unit_tensors(&s->model, 0, t);
    char with[FY_HF_NAME_MAX + 16];
    snprintf(with, sizeof with, "%s%s", a->hf_prefix, t[0].hf_name);
    snprintf(s->prefix, sizeof s->prefix, "%s", a->hf_prefix);
    if (fy_st_find(s->reader, with) != NULL)
        return 0;
    s->prefix[0] = 0;
    if (fy_st_find(s->reader, t[0].hf_name) != NULL)
        return 0;
    fy_error("%s: tensor %s is missing: not the %s checkpoint that %s describes (other layouts "
             "are not supported)", s->ckpt, with, a->hf_architectures[0], s->config);
    return -EINVAL;
}

static int src_open(struct fy_hf_src *s, const char *dir)
{
    size_t dlen = strlen(dir);
    while (dlen > 1 && dir[dlen - 1] == '/')
        dlen--;
    FY_REQUIRE(dlen + 64 < sizeof s->dir, -ENAMETOOLONG, "path too long: %.200s", dir);
    memcpy(s->dir, dir, dlen);
    s->dir[dlen] = 0;
    struct stat st;
    if (stat(s->dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        int e = stat(s->dir, &st) != 0 ? errno : ENOTDIR;
        fy_error("%s: %s: give a Hugging Face model directory (config.json, model.safetensors)",
                 s->dir, strerror(e));
        return -e;
    }
    snprintf(s->config, sizeof s->config, "%s/%s", s->dir, FY_HF_CONFIG_NAME);
    if (access(s->config, F_OK) != 0) {
        fy_error("%s: missing: a Hugging Face model directory has a config.json", s->config);
        return -ENOENT;
    }
    FY_TRY(fy_hf_slurp(s->config, &s->config_text, &s->config_len));
    cJSON *root;
    FY_TRY(fy_hf_parse_json(s->config, s->config_text, s->config_len, &root));
    int rc = config_from_json(s->config, root, &s->model);
    if (rc == 0)
        say_dropout(s->config, root);
    cJSON_Delete(root);
    FY_TRY(rc);
    FY_TRY(fy_hf_carried_load(s->dir, &s->carried));
    FY_TRY(find_checkpoint(s));
    FY_TRY(fy_st_open(&s->reader, s->ckpt));
    FY_TRY(find_prefix(s));
    s->dtype = -1;
    struct fy_hf_tensors p;
    for (unsigned u = 0; u < fy_model_unit_count(&s->model); u++) {
        fy_hf_tensors(&s->model, u, s->prefix, &p);
        for (unsigned k = 0; k < p.n; k++)
            FY_TRY(check_param(s, &p.t[k], p.name[k]));
    }
    FY_TRY(check_extra(s));
    if (s->lm_head != NULL && s->dtype != s->lm_head->dtype)
        s->dtype = 0;
    return 0;
}

int fy_hf_open(struct fy_hf_src **out, const char *dir)
{
    *out = NULL;
    struct fy_hf_src *s = calloc(1, sizeof *s);
    FY_REQUIRE(s != NULL, -ENOMEM, "%s: out of memory", dir);
    int rc = src_open(s, dir);
    if (rc < 0) {
        fy_hf_destroy(&s);
        return rc;
    }
    *out = s;
    return 0;
}

void fy_hf_destroy(struct fy_hf_src **sp)
{
    struct fy_hf_src *s = sp ? *sp : NULL;
    if (s == NULL)
        return;
    fy_st_destroy(&s->reader);
    free(s->config_text);
    fy_hf_carried_free(&s->carried);
    free(s->buf);
    free(s);
    *sp = NULL;
}

int fy_hf_ensure_buf(float **buf, size_t *have, size_t n)
{
    if (*buf != NULL || n == 0)
        return 0;
    *buf = malloc(n * sizeof **buf);
    FY_REQUIRE(*buf != NULL, -ENOMEM, "out of memory for a tensor of %zu floats", n);
    *have = n;
    return 0;
}

static int check_tied(struct fy_hf_src *s, const float *wte)
{
    size_t n = (size_t)s->model.vocab * s->model.n_embd;
    FY_TRY(fy_st_read_f32(s->reader, s->lm_head, s->buf, n));
    for (size_t i = 0; i < n; i++)
        if (memcmp(&s->buf[i], &wte[i], sizeof(float)) != 0) {
            fy_error("%s: tensor lm_head.weight differs from %swte.weight (element %zu: %g, not "
                     "%g): an untied LM head is not supported (the head is tied to wte here)",
                     s->lm_head->file, s->prefix, i, (double)s->buf[i], (double)wte[i]);
            return -EINVAL;
        }
    return 0;
}

int fy_hf_read_unit(struct fy_hf_src *s, unsigned unit, float *params)
{
    FY_REQUIRE(unit < fy_model_unit_count(&s->model), -EINVAL, "%s: no unit %u", s->ckpt, unit);
    FY_TRY(fy_hf_ensure_buf(&s->buf, &s->buf_n, s->buf_n));
    struct fy_hf_tensors p;
    fy_hf_tensors(&s->model, unit, s->prefix, &p);
    for (unsigned k = 0; k < p.n; k++) {
        const struct fy_tensor_spec *spec = &p.t[k];
        const struct fy_st_tensor *t = fy_st_find(s->reader, p.name[k]);
        FY_REQUIRE(t != NULL, -EINVAL, "%s: tensor %s is missing", s->ckpt, p.name[k]);
        if (!spec->transposed) {
            FY_TRY(fy_st_read_f32(s->reader, t, params + spec->offset, t->numel));
            continue;
        }
        FY_TRY(fy_st_read_f32(s->reader, t, s->buf, t->numel));
        fy_hf_transpose(params + spec->offset, s->buf, (size_t)spec->shape[0],
                        (size_t)spec->shape[1]);
    }
    if (unit == 0 && s->lm_head != NULL)
        FY_TRY(check_tied(s, params));
    return 0;
}

static int add_dtype(cJSON *dtypes, const char *name, const struct fy_st_reader *r)
{
    const struct fy_st_tensor *t = fy_st_find(r, name);
    return t != NULL && cJSON_AddStringToObject(dtypes, name, fy_st_dtype_name(t->dtype)) != NULL
               ? 0
               : -ENOMEM;
}

static char *source_json(const struct fy_hf_src *s)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL && cJSON_AddStringToObject(root, "format", FY_HF_SOURCE_FORMAT) &&
             cJSON_AddNumberToObject(root, "version", 1) &&
             cJSON_AddStringToObject(root, "source", s->dir) &&
             cJSON_AddStringToObject(root, "checkpoint", s->ckpt) &&
             cJSON_AddStringToObject(root, "prefix", s->prefix) &&
             cJSON_AddBoolToObject(root, "lm_head", s->lm_head != NULL);
    cJSON *meta = ok ? cJSON_AddObjectToObject(root, "metadata") : NULL;
    ok = meta != NULL;
    for (size_t i = 0; ok && i < fy_st_metadata_count(s->reader); i++) {
        const char *k, *v;
        fy_st_metadata_at(s->reader, i, &k, &v);
        ok = cJSON_AddStringToObject(meta, k, v) != NULL;
    }
    cJSON *dtypes = ok ? cJSON_AddObjectToObject(root, "dtypes") : NULL;
    ok = dtypes != NULL;
    struct fy_hf_tensors p;
    for (unsigned u = 0; ok && u < fy_model_unit_count(&s->model); u++) {
        fy_hf_tensors(&s->model, u, s->prefix, &p);
        for (unsigned k = 0; ok && k < p.n; k++)
            ok = add_dtype(dtypes, p.name[k], s->reader) == 0;
    }
    if (ok && s->lm_head != NULL)
        ok = add_dtype(dtypes, "lm_head.weight", s->reader) == 0;
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    return text;
}

int fy_hf_save_source(const struct fy_hf_src *s, const char *hf_dir)
{
    struct stat st;
    FY_REQUIRE(lstat(hf_dir, &st) != 0, -EEXIST, "%s already exists: remove it first", hf_dir);
    char *text = source_json(s);
    FY_REQUIRE(text != NULL, -ENOMEM, "%s: out of memory building %s", hf_dir,
               FY_HF_SOURCE_NAME);
    char tmp[PATH_MAX] = "";
    int rc = fy_hf_make_temp_dir(hf_dir, tmp, sizeof tmp);
    if (rc == 0)
        rc = fy_hf_write_file(tmp, FY_HF_CONFIG_NAME, s->config_text, s->config_len);
    if (rc == 0)
        rc = fy_hf_write_file(tmp, FY_HF_SOURCE_NAME, text, strlen(text));
    if (rc == 0)
        rc = fy_hf_carried_write(tmp, &s->carried);
    free(text);
    if (rc == 0)
        rc = fy_fsync_dir(tmp);
    if (rc == 0 && rename(tmp, hf_dir) != 0) {
        rc = -errno;
        fy_error("cannot rename %s to %s: %s", tmp, hf_dir, strerror(-rc));
    }
    if (rc == 0)
        return fy_fsync_parent(hf_dir);
    if (tmp[0] != 0)
        fy_hf_remove_dir_files(tmp);
    return rc;
}

