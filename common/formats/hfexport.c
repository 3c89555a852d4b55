/* Hugging Face export (common/formats/hfexport.h): names, shapes and transposes from the family's
 * tensor table, the source's dtypes and config.json kept at import, files written into a temporary
 * directory beside the target and renamed into place only when whole. */
#include "common/formats/hfexport.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/base/check.h"
#include "common/base/fsutil.h"
#include "common/formats/hf.h"
#include "common/formats/safetensors.h"
#include "common/formats/stwriter.h"

struct fy_hf_writer {
    char dir[PATH_MAX]; /* the target */
    char tmp[PATH_MAX]; /* the temporary directory beside it, "" when none */
    struct fy_model_config model;
    struct fy_st_writer *st;
    char prefix[16];
    int lm_head;
    int *dtypes; /* export dtype per parameter, in unit order (then lm_head) */
    int lm_head_dtype;
    int dtype; /* of every tensor written, or 0: mixed */
    float *buf;
    size_t buf_n;
    unsigned next_unit;
    char *config_text; /* config.json to write */
    size_t config_len;
    struct fy_hf_carried carried; /* the source's generation config and tokenizer files */
    int replace; /* dir exists and is not empty (overwrite) */
};

const char *fy_hf_writer_dtype(const struct fy_hf_writer *w)
{
    return w->dtype ? fy_st_dtype_name(w->dtype) : "mixed";
}

/* Files an export writes (and replaces in an existing directory). */
static int is_model_file(const struct fy_hf_writer *w, const char *name)
{
    size_t n = strlen(name);
    if (fy_hf_carried_has(&w->carried, name))
        return 1;
    if (strcmp(name, FY_HF_CONFIG_NAME) == 0 || strcmp(name, FY_ST_SINGLE_NAME) == 0 ||
        strcmp(name, FY_ST_INDEX_NAME) == 0)
        return 1;
    return strncmp(name, "model-", 6) == 0 && n > 12 &&
           strcmp(name + n - 12, ".safetensors") == 0 && strstr(name, "-of-") != NULL;
}

/* Whether dir may be written: absent, or an empty directory, or (overwrite) a directory of files. */
static int check_target(struct fy_hf_writer *w, int overwrite)
{
    struct stat st;
    if (lstat(w->dir, &st) != 0) {
        int e = errno;
        FY_REQUIRE(e == ENOENT, -e, "%s: %s", w->dir, strerror(e));
        return 0;
    }
    FY_REQUIRE(S_ISDIR(st.st_mode), -ENOTDIR,
               "%s exists and is not a directory: give a new or empty directory for the model",
               w->dir);
    DIR *d = opendir(w->dir);
    FY_SYS(d == NULL ? -1 : 0, "cannot list %s", w->dir);
    int rc = 0, entries = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        entries++;
        struct stat es;
        if (fstatat(dirfd(d), e->d_name, &es, AT_SYMLINK_NOFOLLOW) != 0)
            rc = -errno;
        else if (overwrite && S_ISDIR(es.st_mode)) {
            fy_error("%s holds a directory (%s): --overwrite replaces the model files of a model "
                     "directory, give a new or empty directory instead",
                     w->dir, e->d_name);
            rc = -EISDIR;
        }
    }
    closedir(d);
    FY_REQUIRE(rc == 0 || rc == -EISDIR, rc, "%s: cannot inspect its files: %s", w->dir,
               strerror(-rc));
    FY_TRY(rc);
    FY_REQUIRE(entries == 0 || overwrite, -EEXIST,
               "%s exists and is not empty: give a new or empty directory, or pass --overwrite to "
               "replace the model files in it (its other files, such as a tokenizer's, are kept)",
               w->dir);
    w->replace = entries > 0;
    return 0;
}

static int dtype_of(const cJSON *dtypes, const char *name, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(dtypes, name);
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    for (int d = FY_ST_F32; d <= FY_ST_F16; d++)
        if (strcmp(s, fy_st_dtype_name(d)) == 0)
            return d;
    fy_error("%s: no dtype for tensor %s (the file is damaged: import the model again)", path, name);
    return -EINVAL;
}

static const char *torch_dtype_name(int dtype)
{
    return dtype == FY_ST_BF16 ? "bfloat16" : dtype == FY_ST_F16 ? "float16" : "float32";
}

/* The original config.json, with its torch_dtype (or dtype) changed where the export's differs. */
static int export_config(struct fy_hf_writer *w, const char *path, char *text, size_t len)
{
    w->config_text = text;
    w->config_len = len;
    if (w->dtype == 0)
        return 0;
    cJSON *root;
    FY_TRY(fy_hf_parse_json(path, text, len, &root));
    int changed = 0, rc = 0;
    const char *keys[] = {"torch_dtype", "dtype"};
    for (int k = 0; k < 2 && rc == 0; k++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[k]);
        const char *want = torch_dtype_name(w->dtype);
        if (!cJSON_IsString(v) || strcmp(v->valuestring, want) == 0)
            continue;
        fy_info("%s: \"%s\" %s -> %s (the exported tensors' dtype)", w->dir, keys[k],
                v->valuestring, want);
        cJSON *nv = cJSON_CreateString(want);
        if (nv == NULL || !cJSON_ReplaceItemInObjectCaseSensitive(root, keys[k], nv))
            rc = -ENOMEM;
        changed = 1;
    }
    char *out = rc == 0 && changed ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    FY_REQUIRE(rc == 0 && (!changed || out != NULL), -ENOMEM, "%s: out of memory", path);
    if (changed) {
        size_t n = strlen(out);
        char *t = realloc(out, n + 2);
        FY_REQUIRE(t != NULL, -ENOMEM, "%s: out of memory", path);
        t[n] = '\n';
        t[n + 1] = 0;
        free(w->config_text);
        w->config_text = t;
        w->config_len = n + 1;
    }
    return 0;
}

/* The model's tensors in all. */
static unsigned total_tensors(const struct fy_model_config *c)
{
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    unsigned n = 0;
    for (unsigned u = 0; u < fy_model_unit_count(c); u++)
        n += fy_unit_tensors(c, u, t);
    return n;
}

/* Reads RUN/hf (config.json, source.json): names, dtypes and metadata for the export. */
static int load_source(struct fy_hf_writer *w, const char *src, int force, cJSON **meta_out,
                       cJSON **root_out)
{
    char path[PATH_MAX], spath[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", src, FY_HF_CONFIG_NAME);
    snprintf(spath, sizeof spath, "%s/%s", src, FY_HF_SOURCE_NAME);
    struct fy_model_config m;
    FY_TRY(fy_hf_read_config(path, &m));
    if (!fy_hf_same_model(&m, &w->model)) {
        char have[160], want[160];
        fy_model_config_describe(&m, have, sizeof have);
        fy_model_config_describe(&w->model, want, sizeof want);
        fy_error("%s describes another model (%s) than the store's (%s): the run directory was "
                 "changed by hand; import the model again",
                 path, have, want);
        return -EINVAL;
    }
    char *text;
    size_t len;
    FY_TRY(fy_hf_slurp(spath, &text, &len));
    cJSON *root;
    int rc = fy_hf_parse_json(spath, text, len, &root);
    free(text);
    FY_TRY(rc);
    *root_out = root;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(root, "prefix");
    const cJSON *lm = cJSON_GetObjectItemCaseSensitive(root, "lm_head");
    const cJSON *dtypes = cJSON_GetObjectItemCaseSensitive(root, "dtypes");
    FY_REQUIRE(cJSON_IsString(fmt) && strcmp(fmt->valuestring, FY_HF_SOURCE_FORMAT) == 0 &&
                   cJSON_IsString(prefix) &&
                   (strcmp(prefix->valuestring, "") == 0 ||
                    strcmp(prefix->valuestring, fy_model_arch(&w->model)->hf_prefix) == 0) &&
                   cJSON_IsBool(lm) && cJSON_IsObject(dtypes),
               -EINVAL, "%s: not a record of an imported model (damaged?): import the model again",
               spath);
    snprintf(w->prefix, sizeof w->prefix, "%s", prefix->valuestring);
    w->lm_head = cJSON_IsTrue(lm);
    *meta_out = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    int f16 = 0;
    struct fy_hf_tensors p;
    unsigned i = 0;
    for (unsigned u = 0; u < fy_model_unit_count(&w->model); u++) {
        fy_hf_tensors(&w->model, u, w->prefix, &p);
        for (unsigned k = 0; k < p.n; k++, i++) {
            int d = dtype_of(dtypes, p.name[k], spath);
            FY_TRY(d);
            f16 |= d == FY_ST_F16;
            w->dtypes[i] = force ? force : d == FY_ST_F16 ? FY_ST_F32 : d;
        }
    }
    if (w->lm_head) {
        int d = dtype_of(dtypes, "lm_head.weight", spath);
        FY_TRY(d);
        f16 |= d == FY_ST_F16;
        w->lm_head_dtype = force ? force : d == FY_ST_F16 ? FY_ST_F32 : d;
    }
    if (f16 && !force)
        fy_info("%s: the source's F16 tensors are written as F32 (the safetensors writer has no "
                "F16 output; --dtype bf16 writes BF16)",
                w->dir);
    FY_TRY(fy_hf_carried_load(src, &w->carried));
    FY_TRY(fy_hf_slurp(path, &text, &len));
    w->dtype = w->dtypes[0];
    for (unsigned k = 1; k < i; k++)
        if (w->dtypes[k] != w->dtype)
            w->dtype = 0;
    if (w->lm_head && w->lm_head_dtype != w->dtype)
        w->dtype = 0;
    return export_config(w, path, text, len);
}

static int declare(struct fy_hf_writer *w, const char *name, int dtype, int ndim,
                   const uint64_t *shape)
{
    return fy_st_writer_declare(w->st, name, dtype, ndim, shape);
}

static int writer_open(struct fy_hf_writer *w, const char *dir,
                       const struct fy_hf_export_opts *o)
{
    size_t dlen = strlen(dir);
    while (dlen > 1 && dir[dlen - 1] == '/')
        dlen--;
    FY_REQUIRE(dlen > 0 && dlen + 64 < sizeof w->dir, -ENAMETOOLONG, "bad path: %.200s", dir);
    memcpy(w->dir, dir, dlen);
    w->dir[dlen] = 0;
    FY_REQUIRE(o->dtype == 0 || o->dtype == FY_ST_F32 || o->dtype == FY_ST_BF16, -EINVAL,
               "%s: the export dtype must be F32 or BF16", w->dir);
    FY_TRY(check_target(w, o->overwrite));
    unsigned np = total_tensors(&w->model);
    w->dtypes = calloc(np, sizeof *w->dtypes);
    FY_REQUIRE(w->dtypes != NULL, -ENOMEM, "out of memory");
    cJSON *meta = NULL, *root = NULL;
    int rc = 0;
    w->tmp[0] = 0; /* no temporary directory until one is made */
    if (o->source != NULL) {
        FY_TRY_OUT(rc, load_source(w, o->source, o->dtype, &meta, &root));
    } else {
        /* the family's prefix, as its checkpoints name their tensors */
        snprintf(w->prefix, sizeof w->prefix, "%s", fy_model_arch(&w->model)->hf_prefix);
        w->dtype = o->dtype ? o->dtype : FY_ST_F32;
        for (unsigned k = 0; k < np; k++)
            w->dtypes[k] = w->dtype;
        w->config_text =
            fy_model_arch(&w->model)->hf_config_write(&w->model, torch_dtype_name(w->dtype));
        w->config_len = w->config_text ? strlen(w->config_text) : 0;
        if (w->config_text == NULL) {
            rc = -ENOMEM;
            goto out;
        }
    }
    FY_TRY_OUT(rc, fy_hf_make_temp_dir(w->dir, w->tmp, sizeof w->tmp));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", w->tmp, FY_ST_SINGLE_NAME);
    FY_TRY_OUT(rc, o->max_shard_bytes
                       ? fy_st_writer_new_sharded(&w->st, w->tmp, o->max_shard_bytes, 0)
                       : fy_st_writer_new(&w->st, path, 0));
    /* The source's metadata, in order; transformers wants format "pt". */
    int has_format = 0;
    for (const cJSON *m = cJSON_IsObject(meta) ? meta->child : NULL; m; m = m->next)
        if (cJSON_IsString(m)) {
            FY_TRY_OUT(rc, fy_st_writer_metadata(w->st, m->string, m->valuestring));
            has_format |= strcmp(m->string, "format") == 0;
        }
    if (!has_format)
        FY_TRY_OUT(rc, fy_st_writer_metadata(w->st, "format", "pt"));
    struct fy_hf_tensors p;
    unsigned i = 0;
    for (unsigned u = 0; u < fy_model_unit_count(&w->model); u++) {
        fy_hf_tensors(&w->model, u, w->prefix, &p);
        for (unsigned k = 0; k < p.n; k++, i++) {
            const struct fy_tensor_spec *t = &p.t[k];
            FY_TRY_OUT(rc, declare(w, p.name[k], w->dtypes[i], t->ndim, t->shape));
            if (t->transposed && fy_tensor_numel(t) > w->buf_n)
                w->buf_n = (size_t)fy_tensor_numel(t);
            if (u == 0 && k == 0 && w->lm_head)
                FY_TRY_OUT(rc, declare(w, "lm_head.weight", w->lm_head_dtype, 2, t->shape));
        }
    }
out:
    cJSON_Delete(root);
    return rc;
}

int fy_hf_writer_new(struct fy_hf_writer **out, const char *dir,
                         const struct fy_model_config *model, const struct fy_hf_export_opts *o)
{
    *out = NULL;
    struct fy_hf_writer *w = calloc(1, sizeof *w);
    FY_REQUIRE(w != NULL, -ENOMEM, "%s: out of memory", dir);
    w->model = *model;
    int rc = writer_open(w, dir, o);
    if (rc < 0) {
        fy_hf_writer_destroy(&w);
        return rc;
    }
    *out = w;
    return 0;
}

int fy_hf_writer_put_unit(struct fy_hf_writer *w, unsigned unit, const float *params)
{
    FY_REQUIRE(unit == w->next_unit && unit < fy_model_unit_count(&w->model), -EINVAL,
               "%s: unit %u written out of order (expected %u)", w->dir, unit, w->next_unit);
    FY_TRY(fy_hf_ensure_buf(&w->buf, &w->buf_n, w->buf_n));
    struct fy_hf_tensors p;
    fy_hf_tensors(&w->model, unit, w->prefix, &p);
    for (unsigned k = 0; k < p.n; k++) {
        const struct fy_tensor_spec *t = &p.t[k];
        uint64_t numel = fy_tensor_numel(t);
        const float *src = params + t->offset;
        if (t->transposed) {
            /* ours [out][in] -> stored [in][out]: the transpose of an [out][in] matrix */
            fy_hf_transpose(w->buf, src, (size_t)t->shape[1], (size_t)t->shape[0]);
            src = w->buf;
        }
        FY_TRY(fy_st_writer_put_f32(w->st, p.name[k], src, numel));
        if (unit == 0 && k == 0 && w->lm_head)
            FY_TRY(fy_st_writer_put_f32(w->st, "lm_head.weight", src, numel));
    }
    w->next_unit++;
    return 0;
}

/* Moves the finished temporary directory to w->dir. */
static int put_in_place(struct fy_hf_writer *w)
{
    if (!w->replace) {
        /* Absent, or an empty directory (which rename replaces). */
        FY_SYS(rename(w->tmp, w->dir), "cannot rename %s to %s", w->tmp, w->dir);
        w->tmp[0] = 0;
        return fy_fsync_parent(w->dir);
    }
    /* Keep the directory's other files (tokenizer, README): link them into the new copy. */
    DIR *d = opendir(w->dir);
    FY_SYS(d == NULL ? -1 : 0, "cannot list %s", w->dir);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 || is_model_file(w, e->d_name))
            continue;
        char from[PATH_MAX], to[PATH_MAX];
        snprintf(from, sizeof from, "%s/%s", w->dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", w->tmp, e->d_name);
        if (link(from, to) != 0) {
            rc = -errno;
            fy_error("cannot keep %s in the new export (link to %s): %s", from, to, strerror(-rc));
        }
    }
    closedir(d);
    FY_TRY(rc);
    FY_TRY(fy_fsync_dir(w->tmp));
    FY_SYS(renameat2(AT_FDCWD, w->tmp, AT_FDCWD, w->dir, RENAME_EXCHANGE),
           "cannot exchange %s with %s (a filesystem without RENAME_EXCHANGE? export to a new "
           "directory instead)",
           w->tmp, w->dir);
    /* w->tmp now holds the previous copy: its model files and links to the kept ones. */
    fy_hf_remove_dir_files(w->tmp);
    struct stat st;
    if (lstat(w->tmp, &st) == 0)
        fy_warn("the previous model files were moved to %s and could not all be removed: remove "
                "it by hand",
                w->tmp);
    w->tmp[0] = 0;
    return fy_fsync_parent(w->dir);
}

int fy_hf_writer_finish(struct fy_hf_writer **wp)
{
    struct fy_hf_writer *w = *wp;
    int rc = 0;
    if (w->next_unit != fy_model_unit_count(&w->model)) {
        fy_error("%s: export finished after %u of %u units", w->dir, w->next_unit,
                 fy_model_unit_count(&w->model));
        rc = -EINVAL;
    }
    if (rc == 0)
        rc = fy_st_writer_finish(&w->st);
    if (rc == 0)
        rc = fy_hf_write_file(w->tmp, FY_HF_CONFIG_NAME, w->config_text, w->config_len);
    if (rc == 0)
        rc = fy_hf_carried_write(w->tmp, &w->carried);
    if (rc == 0)
        rc = fy_fsync_dir(w->tmp);
    if (rc == 0)
        rc = put_in_place(w);
    fy_hf_writer_destroy(wp);
    return rc;
}

void fy_hf_writer_destroy(struct fy_hf_writer **wp)
{
    struct fy_hf_writer *w = wp ? *wp : NULL;
    if (w == NULL)
        return;
    fy_st_writer_destroy(&w->st);
    if (w->tmp[0] != 0)
        fy_hf_remove_dir_files(w->tmp);
    free(w->dtypes);
    free(w->buf);
    free(w->config_text);
    fy_hf_carried_free(&w->carried);
    free(w);
    *wp = NULL;
}
