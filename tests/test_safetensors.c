/* Tests of safetensors checkpoints (common/formats/safetensors): single-file and sharded round
 * trips bit for bit, the format checked by an independent Python reading
 * (tests/reference/safetensors_check.py) both ways, exact f16 conversion, every refusal of the
 * reader with its one-line message, and writers that leave nothing under a final name when
 * abandoned or failing. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/dtype.h"
#include "common/formats/safetensors.h"
#include "common/formats/stwriter.h"
#include "tests/refmodel.h"
#include "tests/testutil.h"

#define PY_TIMEOUT_S 60

static char *tmpdir;
static char script[4096];
static int have_python;

static int setup(void **state)
{
    tmpdir = fy_test_tmpdir("safetensors");
    return tmpdir == NULL ? -1 : 0;
}

static int teardown(void **state)
{
    fy_test_rmdir(tmpdir);
    free(tmpdir);
    tmpdir = NULL;
    return 0;
}

static const char *tpath(const char *name) { return fy_test_path(tmpdir, name); }

static int count_entries(const char *dir)
{
    int n = fy_test_count_entries(dir);
    assert_true(n >= 0);
    return n;
}

static uint32_t f32_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static float bits_f32(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len > 0)
        assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* A hand-made file: the given length field, header bytes, then data_len bytes of 0x11. */
static void make_raw(const char *path, uint64_t len_field, const char *hdr, size_t hdr_len,
                     size_t data_len)
{
    size_t total = 8 + hdr_len + data_len;
    uint8_t *b = malloc(total);
    assert_non_null(b);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(len_field >> (8 * i));
    memcpy(b + 8, hdr, hdr_len);
    memset(b + 8 + hdr_len, 0x11, data_len);
    write_bytes(path, b, total);
    free(b);
}

static void make_st(const char *path, const char *json, size_t data_len)
{
    make_raw(path, strlen(json), json, strlen(json), data_len);
}

static int python(const char *mode, const char *a, const char *b, const char *c)
{
    char *argv[] = {"python3", script, (char *)mode, (char *)a, (char *)b, (char *)c, NULL};
    return fy_refmodel_run(argv, PY_TIMEOUT_S);
}

/* ---- refusals: each with its code and exactly one line naming the file (and tensor) ---- */

static int open_fn(void *arg)
{
    struct fy_st_reader *r = NULL;
    int rc = fy_st_open(&r, arg);
    assert_true(rc < 0 || r != NULL);
    fy_st_destroy(&r);
    return rc;
}

static void expect_line(int (*fn)(void *), void *arg, int code, const char *file,
                        const char *want1, const char *want2)
{
    int rc = 0;
    char *log = fy_test_capture_stderr(fn, arg, &rc);
    assert_non_null(log);
    if (rc != code)
        fail_msg("expected %d (%s), got %d (%s); log: %s", code, strerror(-code), rc,
                 strerror(-rc), log);
    assert_int_equal(fy_test_count_lines(log), 1);
    const char *w[] = {file, want1, want2};
    for (int i = 0; i < 3; i++)
        if (w[i] != NULL && strstr(log, w[i]) == NULL)
            fail_msg("log '%s' lacks '%s'", log, w[i]);
    free(log);
}

static void expect_open_refused(const char *path, int code, const char *want1, const char *want2)
{
    expect_line(open_fn, (void *)path, code, path, want1, want2);
}

/* ---- f16 ---- */

static void test_f16_to_f32(void **state)
{
    static const struct { uint16_t h; uint32_t f; } cases[] = {
        {0x0000, 0x00000000}, {0x8000, 0x80000000}, {0x3c00, 0x3f800000}, {0xc000, 0xc0000000},
        {0x7bff, 0x477fe000}, /* 65504, the largest */
        {0x0001, 0x33800000}, /* 2^-24, the smallest subnormal */
        {0x03ff, 0x387fc000}, /* the largest subnormal */
        {0x8200, 0xb8000000}, {0x0400, 0x38800000}, /* the smallest normal, 2^-14 */
        {0x7c00, 0x7f800000}, {0xfc00, 0xff800000},
        {0x7e00, 0x7fc00000}, {0xfc01, 0xff802000}, {0x7d00, 0x7fa00000}, /* NaN payloads kept */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        assert_int_equal(f32_bits(fy_f16_to_f32(cases[i].h)), cases[i].f);
    /* and the writer's bf16 rounding: ties to even, down and up */
    assert_int_equal(fy_f32_to_bf16(bits_f32(0x3f808000)), 0x3f80);
    assert_int_equal(fy_f32_to_bf16(bits_f32(0x3f818000)), 0x3f82);
    assert_int_equal(fy_f32_to_bf16(bits_f32(0x3f808001)), 0x3f81);
#ifdef __FLT16_MAX__
    /* Every value against the compiler's own conversion. */
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 x;
        uint16_t hb = (uint16_t)h;
        memcpy(&x, &hb, 2);
        float want = (float)x, got = fy_f16_to_f32(hb);
        if (isnan(want))
            assert_true(isnan(got) && signbit(got) == signbit(want));
        else if (f32_bits(got) != f32_bits(want))
            fail_msg("f16 0x%04x: got 0x%08x, want 0x%08x", h, f32_bits(got), f32_bits(want));
    }
#endif
}

/* ---- round trips ---- */

struct spec_tensor {
    const char *name;
    int dtype, ndim;
    uint64_t shape[3];
    uint64_t numel;
    float *f32;    /* values given to the writer */
    uint32_t *bits; /* stored bits: f32 bits, or bf16 in the low half */
};

static void fill_spec(struct spec_tensor *t, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) {
        t[i].numel = 1;
        for (int d = 0; d < t[i].ndim; d++)
            t[i].numel *= t[i].shape[d];
        t[i].f32 = calloc(t[i].numel + 1, sizeof(float));
        t[i].bits = calloc(t[i].numel + 1, sizeof(uint32_t));
        for (uint64_t k = 0; k < t[i].numel; k++) {
            float v = fy_test_uniform(&seed, -4.0f, 4.0f);
            if (k == 1)
                v = bits_f32(0x3f808000); /* a bf16 tie: rounds to even (down) */
            if (k == 2)
                v = bits_f32(0x3f818000); /* a tie that rounds up */
            t[i].f32[k] = v;
            t[i].bits[k] = t[i].dtype == FY_ST_F32 ? f32_bits(v) : fy_f32_to_bf16(v);
        }
    }
}

static void free_spec(struct spec_tensor *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(t[i].f32);
        free(t[i].bits);
    }
}

/* Writes the spec (for safetensors_check.py) as JSON. */
static void write_spec_json(const char *path, const struct spec_tensor *t, size_t n,
                            const char *const *meta, size_t n_meta)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *m = cJSON_AddObjectToObject(root, "metadata");
    for (size_t i = 0; i < n_meta; i++)
        cJSON_AddStringToObject(m, meta[2 * i], meta[2 * i + 1]);
    cJSON *arr = cJSON_AddArrayToObject(root, "tensors");
    for (size_t i = 0; i < n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", t[i].name);
        cJSON_AddStringToObject(o, "dtype", fy_st_dtype_name(t[i].dtype));
        cJSON *sh = cJSON_AddArrayToObject(o, "shape");
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *b = cJSON_AddArrayToObject(o, "bits");
        for (uint64_t k = 0; k < t[i].numel; k++)
            cJSON_AddItemToArray(b, cJSON_CreateNumber((double)t[i].bits[k]));
        cJSON_AddItemToArray(arr, o);
    }
    char *text = cJSON_PrintUnformatted(root);
    assert_non_null(text);
    write_bytes(path, text, strlen(text));
    free(text);
    cJSON_Delete(root);
}

/* Declares and writes every tensor: F32 in three pieces, BF16 from f32, every other BF16 tensor
 * through put_raw. */
static void write_all(struct fy_st_writer *w, struct spec_tensor *t, size_t n,
                      const char *const *meta, size_t n_meta)
{
    for (size_t i = 0; i < n_meta; i++)
        assert_int_equal(fy_st_writer_metadata(w, meta[2 * i], meta[2 * i + 1]), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(fy_st_writer_declare(w, t[i].name, t[i].dtype, t[i].ndim, t[i].shape), 0);
    for (size_t j = n; j-- > 0;) { /* in reverse: any order is fine */
        const struct spec_tensor *s = &t[j];
        if (s->dtype == FY_ST_F32) {
            uint64_t a = s->numel / 3, b = 2 * s->numel / 3;
            assert_int_equal(fy_st_writer_put_f32(w, s->name, s->f32, a), 0);
            assert_int_equal(fy_st_writer_put_f32(w, s->name, s->f32 + a, b - a), 0);
            assert_int_equal(fy_st_writer_put_f32(w, s->name, s->f32 + b, s->numel - b), 0);
        } else if (j % 4 == 0) {
            assert_int_equal(fy_st_writer_put_f32(w, s->name, s->f32, s->numel), 0);
        } else {
            uint16_t *h = calloc(s->numel + 1, 2);
            for (uint64_t k = 0; k < s->numel; k++)
                h[k] = (uint16_t)s->bits[k];
            assert_int_equal(fy_st_writer_put_raw(w, s->name, h, s->numel * 2), 0);
            free(h);
        }
    }
}

/* Opens path and compares everything with the spec, bit for bit. */
static void read_back(const char *path, const struct spec_tensor *t, size_t n,
                      const char *const *meta, size_t n_meta, size_t want_files)
{
    struct fy_st_reader *r = NULL;
    assert_int_equal(fy_st_open(&r, path), 0);
    assert_int_equal(fy_st_count(r), n);
    assert_int_equal(fy_st_metadata_count(r), n_meta);
    for (size_t i = 0; i < n_meta; i++) {
        const char *k, *v;
        fy_st_metadata_at(r, i, &k, &v);
        assert_string_equal(k, meta[2 * i]);
        assert_string_equal(v, meta[2 * i + 1]);
        assert_string_equal(fy_st_metadata(r, meta[2 * i]), meta[2 * i + 1]);
    }
    assert_null(fy_st_metadata(r, "absent"));
    assert_null(fy_st_find(r, "absent"));
    size_t files = 0;
    const char *last_file = NULL;
    for (size_t i = 0; i < n; i++) {
        const struct fy_st_tensor *x = fy_st_tensor_at(r, i);
        assert_string_equal(x->name, t[i].name); /* declaration order kept */
        assert_ptr_equal(fy_st_find(r, t[i].name), x);
        assert_int_equal(x->dtype, t[i].dtype);
        assert_int_equal(x->ndim, t[i].ndim);
        for (int d = 0; d < x->ndim; d++)
            assert_int_equal(x->shape[d], t[i].shape[d]);
        assert_int_equal(x->numel, t[i].numel);
        assert_int_equal(x->nbytes, t[i].numel * fy_st_dtype_size(t[i].dtype));
        if (last_file == NULL || strcmp(last_file, x->file) != 0)
            files++;
        last_file = x->file;
        uint8_t *raw = malloc(x->nbytes + 1);
        float *f = malloc((x->numel + 1) * sizeof(float));
        assert_int_equal(fy_st_read_raw(r, x, raw, x->nbytes), 0);
        assert_int_equal(fy_st_read_f32(r, x, f, x->numel), 0);
        for (uint64_t k = 0; k < x->numel; k++) {
            uint32_t stored = 0;
            memcpy(&stored, raw + k * (x->nbytes / x->numel), x->nbytes / x->numel);
            assert_int_equal(stored, t[i].bits[k]);
            uint32_t want = t[i].dtype == FY_ST_F32 ? t[i].bits[k] : t[i].bits[k] << 16;
            assert_int_equal(f32_bits(f[k]), want);
        }
        free(raw);
        free(f);
    }
    assert_int_equal(files, want_files);
    fy_st_destroy(&r);
    assert_null(r);
}

#define N_RT 6
static void rt_spec(struct spec_tensor *t)
{
    struct spec_tensor s[N_RT] = {
        {"model.embed.weight", FY_ST_BF16, 2, {5, 7}, 0, NULL, NULL},
        {"model.h.0.attn.c_attn.weight", FY_ST_F32, 2, {3, 4}, 0, NULL, NULL},
        {"model.h.0.ln.bias", FY_ST_BF16, 1, {9}, 0, NULL, NULL},
        {"scalar", FY_ST_F32, 0, {0}, 0, NULL, NULL},
        {"empty", FY_ST_BF16, 2, {0, 3}, 0, NULL, NULL},
        {"caf\xc3\xa9.w", FY_ST_F32, 3, {2, 1, 3}, 0, NULL, NULL},
    };
    memcpy(t, s, sizeof s);
    fill_spec(t, N_RT, 42);
}

static const char *const META[] = {"format", "pt", "producer", "fuyou \xe2\x9c\x93"};

static void test_roundtrip_single(void **state)
{
    struct spec_tensor t[N_RT];
    rt_spec(t);
    const char *p = tpath("model.safetensors");
    struct fy_st_writer *w = NULL;
    assert_int_equal(fy_st_writer_new(&w, p, 0), 0);
    write_all(w, t, N_RT, META, 2);
    assert_int_equal(count_entries(tmpdir), 1); /* only the .tmp while writing */
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(fy_st_writer_finish(&w), 0);
    assert_null(w);
    assert_int_equal(count_entries(tmpdir), 1);
    /* the header length is a multiple of 8, as Hugging Face pads it */
    size_t len = 0;
    uint8_t *b = (uint8_t *)fy_test_slurp(p, &len);
    assert_non_null(b);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | b[i];
    assert_int_equal(hlen % 8, 0);
    free(b);
    read_back(p, t, N_RT, META, 2, 1);
    /* and without metadata */
    const char *q = tpath("nometa.safetensors");
    assert_int_equal(fy_st_writer_new(&w, q, 0), 0);
    write_all(w, t, N_RT, NULL, 0);
    assert_int_equal(fy_st_writer_finish(&w), 0);
    read_back(q, t, N_RT, NULL, 0, 1);
    if (have_python) {
        const char *spec = tpath("spec.json");
        write_spec_json(spec, t, N_RT, META, 2);
        assert_int_equal(python("check", p, spec, NULL), 0);
        write_spec_json(spec, t, N_RT, NULL, 0);
        assert_int_equal(python("check", q, spec, NULL), 0);
    }
    free_spec(t, N_RT);
}

static void test_roundtrip_sharded(void **state)
{
    struct spec_tensor t[N_RT];
    rt_spec(t);
    /* bytes: 70, 48, 18, 4, 0, 24 -> with at most 72 per shard: {70}, {48, 18, 4, 0}, {24} */
    const char *dir = tpath("sharded");
    assert_int_equal(mkdir(dir, 0755), 0);
    struct fy_st_writer *w = NULL;
    assert_int_equal(fy_st_writer_new_sharded(&w, dir, 72, 0), 0);
    write_all(w, t, N_RT, META, 2);
    assert_int_equal(fy_st_writer_finish(&w), 0);
    assert_int_equal(count_entries(dir), 4);
    assert_int_equal(access(tpath("sharded/model-00001-of-00003.safetensors"), F_OK), 0);
    assert_int_equal(access(tpath("sharded/model-00003-of-00003.safetensors"), F_OK), 0);
    assert_int_equal(access(tpath("sharded/" FY_ST_INDEX_NAME), F_OK), 0);
    read_back(dir, t, N_RT, META, 2, 3);
    read_back(tpath("sharded/" FY_ST_INDEX_NAME), t, N_RT, META, 2, 3);
    struct fy_st_reader *r = NULL;
    assert_int_equal(fy_st_open(&r, dir), 0);
    assert_non_null(strstr(fy_st_find(r, "model.h.0.ln.bias")->file, "model-00002-of-00003"));
    fy_st_destroy(&r);

    /* everything within the limit: one model.safetensors, no index, as Hugging Face does */
    const char *one = tpath("one");
    assert_int_equal(mkdir(one, 0755), 0);
    assert_int_equal(fy_st_writer_new_sharded(&w, one, 1 << 20, 0), 0);
    write_all(w, t, N_RT, META, 2);
    assert_int_equal(fy_st_writer_finish(&w), 0);
    assert_int_equal(count_entries(one), 1);
    read_back(one, t, N_RT, META, 2, 1);

    if (have_python) {
        const char *spec = tpath("spec.json");
        write_spec_json(spec, t, N_RT, META, 2);
        assert_int_equal(python("check-dir", dir, spec, "3"), 0);
        assert_int_equal(python("check-dir", one, spec, "1"), 0);
        /* and the check itself notices a difference */
        t[0].bits[3] ^= 1;
        write_spec_json(spec, t, N_RT, META, 2);
        print_message("a deliberate difference for the Python check (its message follows):\n");
        assert_int_equal(python("check-dir", dir, spec, "3"), 1);
    }
    free_spec(t, N_RT);
}

/* A file written by hand in Python, laid out differently from ours, read by our reader. */
static void test_python_written(void **state)
{
    if (!have_python)
        skip();
    const char *p = tpath("py.safetensors"), *e = tpath("py.json");
    assert_int_equal(python("write", p, e, NULL), 0);
    size_t len;
    char *text = fy_test_slurp(e, &len);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    free(text);
    assert_non_null(root);
    struct fy_st_reader *r = NULL;
    assert_int_equal(fy_st_open(&r, p), 0);
    const cJSON *meta = cJSON_GetObjectItem(root, "metadata");
    assert_int_equal(fy_st_metadata_count(r), cJSON_GetArraySize(meta));
    for (const cJSON *m = meta->child; m; m = m->next)
        assert_string_equal(fy_st_metadata(r, m->string), m->valuestring);
    const cJSON *ts = cJSON_GetObjectItem(root, "tensors");
    assert_int_equal(fy_st_count(r), cJSON_GetArraySize(ts));
    int nans = 0, subnormals = 0, infs = 0;
    size_t i = 0;
    for (const cJSON *t = ts->child; t; t = t->next, i++) {
        const struct fy_st_tensor *x = fy_st_tensor_at(r, i);
        assert_string_equal(x->name, cJSON_GetObjectItem(t, "name")->valuestring);
        assert_string_equal(fy_st_dtype_name(x->dtype), cJSON_GetObjectItem(t, "dtype")->valuestring);
        const cJSON *sh = cJSON_GetObjectItem(t, "shape");
        assert_int_equal(x->ndim, cJSON_GetArraySize(sh));
        for (int d = 0; d < x->ndim; d++)
            assert_int_equal(x->shape[d], (uint64_t)cJSON_GetArrayItem(sh, d)->valuedouble);
        const char *hex = cJSON_GetObjectItem(t, "raw_hex")->valuestring;
        assert_int_equal(strlen(hex), 2 * x->nbytes);
        uint8_t *raw = malloc(x->nbytes + 1);
        float *f = malloc((x->numel + 1) * sizeof(float));
        assert_int_equal(fy_st_read_raw(r, x, raw, x->nbytes), 0);
        for (uint64_t k = 0; k < x->nbytes; k++) {
            unsigned byte;
            assert_int_equal(sscanf(hex + 2 * k, "%2x", &byte), 1);
            assert_int_equal(raw[k], byte);
        }
        assert_int_equal(fy_st_read_f32(r, x, f, x->numel), 0);
        const cJSON *want = cJSON_GetObjectItem(t, "f32_bits");
        assert_int_equal(cJSON_GetArraySize(want), x->numel);
        uint64_t k = 0;
        for (const cJSON *v = want->child; v; v = v->next, k++) {
            if (cJSON_IsString(v)) {
                assert_true(isnan(f[k]));
                assert_int_equal(!!signbit(f[k]), v->valuestring[3] == '-');
                nans++;
                continue;
            }
            uint32_t wb = (uint32_t)v->valuedouble;
            if (f32_bits(f[k]) != wb)
                fail_msg("%s[%llu]: got 0x%08x, Python says 0x%08x", x->name,
                         (unsigned long long)k, f32_bits(f[k]), wb);
            if (x->dtype == FY_ST_F16 && fpclassify(f[k]) != FP_ZERO && fabsf(f[k]) < 6.1035e-5f)
                subnormals++;
            infs += isinf(f[k]) != 0;
        }
        free(raw);
        free(f);
    }
    assert_true(nans >= 2 && subnormals >= 4 && infs >= 2);
    fy_st_destroy(&r);
    cJSON_Delete(root);
}

/* ---- the reader's refusals ---- */

static void test_bad_headers(void **state)
{
    const char *p = tpath("bad.safetensors");

    write_bytes(p, "\x10\0\0", 3);
    expect_open_refused(p, -EBADMSG, "shorter than the 8-byte header length", NULL);

    make_raw(p, 0x7fffffffffffull, "{}", 2, 0);
    expect_open_refused(p, -EBADMSG, "header length 140737488355327", "corrupt");

    make_raw(p, 64, "{}", 2, 10);
    expect_open_refused(p, -EBADMSG, "header length 64 runs past the end", NULL);

    make_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]", 4);
    expect_open_refused(p, -EBADMSG, "not valid JSON", NULL);

    make_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}} x", 4);
    expect_open_refused(p, -EBADMSG, "text after the header", NULL);

    make_st(p, "{\"a\xff\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_refused(p, -EBADMSG, "not UTF-8", NULL);

    make_st(p, "[1, 2]", 0);
    expect_open_refused(p, -EBADMSG, "not a JSON object", NULL);

    make_st(p, "{\"ok\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
               "\"w.q\": {\"dtype\": \"Q7\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    expect_open_refused(p, -EBADMSG, "\"w.q\"", "unknown dtype \"Q7\"");

    make_st(p, "{\"pos_ids\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8);
    expect_open_refused(p, -ENOTSUP, "\"pos_ids\"", "dtype I64 is not supported");

    make_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", 20);
    expect_open_refused(p, -EBADMSG, "\"w\"", "needs 24 bytes but data_offsets [0, 20] hold 20");

    make_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [-1, 3], \"data_offsets\": [0, 12]}}", 12);
    expect_open_refused(p, -EBADMSG, "\"w\"", "shape dimension 0 is not a non-negative integer");

    make_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4);
    expect_open_refused(p, -EBADMSG, "\"w\"", "shape dimension 0");

    make_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8);
    expect_open_refused(p, -EBADMSG, "\"w\"", "end before they begin");

    make_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 8);
    expect_open_refused(p, -EBADMSG, "\"w\"", "data_offsets");

    make_st(p, "{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 8);
    expect_open_refused(p, -EBADMSG, "\"w\"", "no \"shape\"");

    make_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], \"data_offsets\": "
               "[0, 4]}}", 4);
    expect_open_refused(p, -EBADMSG, "\"w\"", "9 dimensions");

    make_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 12]}, "
               "\"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]}, "
               "\"b\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [8, 12]}}", 12);
    expect_open_refused(p, -EBADMSG, "tensors \"a\" and \"b\" overlap", NULL);

    make_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, "
               "\"far\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [100, 108]}}", 16);
    expect_open_refused(p, -EBADMSG, "\"far\"", "run past the end of the data (16 bytes)");

    make_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}, "
               "\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", 8);
    expect_open_refused(p, -EBADMSG, "\"a\"", "appears twice");

    make_st(p, "{\"__metadata__\": {\"format\": 1}}", 0);
    expect_open_refused(p, -EBADMSG, "\"format\"", "not a string");

    expect_open_refused(tpath("absent.safetensors"), -ENOENT, "check the path", NULL);
    assert_int_equal(mkdir(tpath("emptydir"), 0755), 0);
    expect_open_refused(tpath("emptydir"), -ENOENT, "not a Hugging Face model directory", NULL);

    /* a good file is accepted, including an empty tensor at any offset and an unpadded header */
    make_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 12]}, "
               "\"e\": {\"dtype\": \"F16\", \"shape\": [0, 2], \"data_offsets\": [4, 4]}}", 12);
    struct fy_st_reader *r = NULL;
    assert_int_equal(fy_st_open(&r, p), 0);
    assert_int_equal(fy_st_count(r), 2);
    fy_st_destroy(&r);
}

struct read_case {
    const char *path, *tensor;
};

static int read_fn(void *arg)
{
    const struct read_case *c = arg;
    struct fy_st_reader *r = NULL;
    int rc = fy_st_open(&r, c->path);
    assert_int_equal(rc, 0);
    const struct fy_st_tensor *t = fy_st_find(r, c->tensor);
    assert_non_null(t);
    float *f = malloc(t->numel * sizeof(float));
    /* the file shrinks after it was opened and checked */
    assert_int_equal(truncate(c->path, 8 + 8), 0);
    rc = fy_st_read_f32(r, t, f, t->numel);
    free(f);
    fy_st_destroy(&r);
    return rc;
}

static void test_truncated(void **state)
{
    struct spec_tensor t[N_RT];
    rt_spec(t);
    const char *p = tpath("t.safetensors");
    struct fy_st_writer *w = NULL;
    assert_int_equal(fy_st_writer_new(&w, p, 0), 0);
    write_all(w, t, N_RT, NULL, 0);
    assert_int_equal(fy_st_writer_finish(&w), 0);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    /* one byte short: the last tensor's data runs past the end */
    assert_int_equal(truncate(p, st.st_size - 1), 0);
    expect_open_refused(p, -EBADMSG, "\"caf\xc3\xa9.w\"", "truncated");
    /* cut inside the header */
    assert_int_equal(truncate(p, 20), 0);
    expect_open_refused(p, -EBADMSG, "runs past the end of the file", "truncated");

    /* a file cut after opening: the read says so, naming the tensor */
    w = NULL;
    assert_int_equal(fy_st_writer_new(&w, p, 1), 0);
    write_all(w, t, N_RT, NULL, 0);
    assert_int_equal(fy_st_writer_finish(&w), 0);
    struct read_case c = {p, "model.embed.weight"};
    expect_line(read_fn, &c, -EBADMSG, p, "tensor \"model.embed.weight\"", "truncated");
    free_spec(t, N_RT);
}

/* Rewrites the index of dir with a text edit: replace `from` by `to`. */
static void edit_index(const char *dir, const char *from, const char *to)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, FY_ST_INDEX_NAME);
    size_t len;
    char *text = fy_test_slurp(path, &len);
    assert_non_null(text);
    char *at = strstr(text, from);
    assert_non_null(at);
    size_t out_len = len - strlen(from) + strlen(to);
    char *out = malloc(out_len + 1);
    memcpy(out, text, (size_t)(at - text));
    memcpy(out + (at - text), to, strlen(to));
    memcpy(out + (at - text) + strlen(to), at + strlen(from), len - (size_t)(at - text) - strlen(from));
    write_bytes(path, out, out_len);
    free(out);
    free(text);
}

static void test_bad_shards(void **state)
{
    struct spec_tensor t[N_RT];
    rt_spec(t);
    const char *dir = tpath("sh");
    const char *index = tpath("sh/" FY_ST_INDEX_NAME);
    assert_int_equal(mkdir(dir, 0755), 0);
    struct fy_st_writer *w = NULL;
    assert_int_equal(fy_st_writer_new_sharded(&w, dir, 72, 0), 0);
    write_all(w, t, N_RT, NULL, 0);
    assert_int_equal(fy_st_writer_finish(&w), 0);
    size_t len;
    char *orig = fy_test_slurp(index, &len);
    assert_non_null(orig);

    /* a tensor the index maps to a shard that does not hold it */
    edit_index(dir, "\"scalar\":", "\"ghost.weight\":\t\"model-00002-of-00003.safetensors\",\n\t\t\"scalar\":");
    expect_open_refused(index, -EBADMSG, "\"ghost.weight\"", "model-00002-of-00003.safetensors");
    write_bytes(index, orig, len);

    /* a shard holds a tensor the index does not list */
    edit_index(dir, "\"scalar\":\t\"model-00002-of-00003.safetensors\",", "");
    expect_open_refused(index, -EBADMSG, "\"scalar\"", "not in the index");
    write_bytes(index, orig, len);

    /* the index maps a tensor to the wrong shard */
    edit_index(dir, "\"scalar\":\t\"model-00002-of-00003.safetensors\"",
               "\"scalar\":\t\"model-00003-of-00003.safetensors\"");
    expect_open_refused(index, -EBADMSG, "\"scalar\"", "another shard");
    write_bytes(index, orig, len);

    /* a shard name that leaves the directory */
    edit_index(dir, "\"scalar\":\t\"model-00002-of-00003.safetensors\"",
               "\"scalar\":\t\"../x.safetensors\"");
    expect_open_refused(index, -EBADMSG, "\"scalar\"", "not a shard file name");
    write_bytes(index, orig, len);

    /* not an index */
    write_bytes(index, "{\"metadata\": {}}", 16);
    expect_open_refused(index, -EBADMSG, "no \"weight_map\"", NULL);
    write_bytes(index, "{\"weight_map\": {", 16);
    expect_open_refused(index, -EBADMSG, "not valid JSON", NULL);
    write_bytes(index, orig, len);

    /* a missing shard: named with the index and a tensor it holds; opened by directory too */
    assert_int_equal(rename(tpath("sh/model-00003-of-00003.safetensors"), tpath("moved")), 0);
    expect_line(open_fn, (void *)dir, -ENOENT, index, "model-00003-of-00003.safetensors",
                "\"caf\xc3\xa9.w\"");
    assert_int_equal(rename(tpath("moved"), tpath("sh/model-00003-of-00003.safetensors")), 0);

    /* a corrupt shard is named as itself */
    const char *s1 = tpath("sh/model-00001-of-00003.safetensors");
    assert_int_equal(truncate(s1, 30), 0);
    expect_line(open_fn, (void *)dir, -EBADMSG, s1, "truncated", NULL);

    free(orig);
    free_spec(t, N_RT);
}

/* ---- the writer: atomic, and clear about mistakes ---- */

static int new_missing_dir_fn(void *arg)
{
    struct fy_st_writer *w = NULL;
    int rc = fy_st_writer_new(&w, arg, 0);
    assert_null(w);
    return rc;
}

static int new_sharded_missing_dir_fn(void *arg)
{
    struct fy_st_writer *w = NULL;
    int rc = fy_st_writer_new_sharded(&w, arg, 100, 0);
    assert_null(w);
    return rc;
}

static int incomplete_fn(void *arg)
{
    struct fy_st_writer *w = NULL;
    assert_int_equal(fy_st_writer_new(&w, arg, 0), 0);
    uint64_t shape[] = {4};
    float v[4] = {1, 2, 3, 4};
    assert_int_equal(fy_st_writer_declare(w, "a", FY_ST_F32, 1, shape), 0);
    assert_int_equal(fy_st_writer_declare(w, "b", FY_ST_BF16, 1, shape), 0);
    assert_int_equal(fy_st_writer_put_f32(w, "a", v, 4), 0);
    assert_int_equal(fy_st_writer_put_f32(w, "b", v, 3), 0);
    return fy_st_writer_finish(&w);
}

static int overfill_fn(void *arg)
{
    struct fy_st_writer *w = arg;
    float v[8] = {0};
    return fy_st_writer_put_f32(w, "a", v, 5);
}

static int undeclared_fn(void *arg)
{
    struct fy_st_writer *w = arg;
    float v[1] = {0};
    return fy_st_writer_put_f32(w, "nope", v, 1);
}

static int late_declare_fn(void *arg)
{
    struct fy_st_writer *w = arg;
    uint64_t shape[] = {1};
    return fy_st_writer_declare(w, "late", FY_ST_F32, 1, shape);
}

static int duplicate_fn(void *arg)
{
    struct fy_st_writer *w = NULL;
    assert_int_equal(fy_st_writer_new(&w, arg, 0), 0);
    assert_int_equal(fy_st_writer_declare(w, "x", FY_ST_F32, 0, NULL), 0);
    assert_int_equal(fy_st_writer_declare(w, "x", FY_ST_F32, 0, NULL), 0);
    return fy_st_writer_finish(&w);
}

static int bad_decl_fn(void *arg)
{
    struct fy_st_writer *w = arg;
    return fy_st_writer_declare(w, "h", FY_ST_F16, 0, NULL);
}

/* A file size limit makes the data write fail for real (as a full disk would). */
static int efbig_fn(void *arg)
{
    struct fy_st_writer *w = NULL;
    assert_int_equal(fy_st_writer_new(&w, arg, 0), 0);
    uint64_t shape[] = {4096};
    assert_int_equal(fy_st_writer_declare(w, "big", FY_ST_F32, 1, shape), 0);
    float *v = calloc(4096, sizeof(float));
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = fy_st_writer_put_f32(w, "big", v, 4096);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, SIG_DFL);
    free(v);
    assert_int_equal(fy_st_writer_finish(&w), rc); /* refuses, quietly: the failure was logged */
    return rc;
}

static void test_writer_atomic(void **state)
{
    /* a directory that does not exist */
    const char *nodir = tpath("no/such/dir/model.safetensors");
    expect_line(new_missing_dir_fn, (void *)nodir, -ENOENT, nodir, "create it first", NULL);
    expect_line(new_sharded_missing_dir_fn, (void *)tpath("nodir"), -ENOENT, tpath("nodir"),
                "create it first", NULL);
    assert_int_equal(count_entries(tmpdir), 0);

    /* abandoned part-way: nothing left, not even the temporary file */
    const char *p = tpath("m.safetensors");
    struct fy_st_writer *w = NULL;
    uint64_t shape[] = {4};
    float v[4] = {1, 2, 3, 4};
    assert_int_equal(fy_st_writer_new(&w, p, 0), 0);
    assert_int_equal(fy_st_writer_declare(w, "a", FY_ST_F32, 1, shape), 0);
    assert_int_equal(fy_st_writer_put_f32(w, "a", v, 2), 0);
    assert_int_equal(count_entries(tmpdir), 1);
    fy_st_writer_destroy(&w);
    assert_null(w);
    fy_st_writer_destroy(&w); /* safe on NULL */
    assert_int_equal(count_entries(tmpdir), 0);

    /* finishing with a tensor incomplete: refused, named, nothing left */
    expect_line(incomplete_fn, (void *)p, -EINVAL, p, "tensor \"b\" has 6 of its 8 bytes", NULL);
    assert_int_equal(count_entries(tmpdir), 0);

    /* a failing write: refused, nothing left */
    expect_line(efbig_fn, (void *)p, -EFBIG, p, "tensor \"big\"", "disk full");
    assert_int_equal(count_entries(tmpdir), 0);

    /* mistakes of the caller */
    expect_line(duplicate_fn, (void *)p, -EINVAL, p, "tensor \"x\" declared twice", NULL);
    assert_int_equal(count_entries(tmpdir), 0);
    assert_int_equal(fy_st_writer_new(&w, p, 0), 0);
    expect_line(bad_decl_fn, w, -EINVAL, p, "\"h\"", "dtype F16 cannot be written");
    assert_int_equal(fy_st_writer_declare(w, "a", FY_ST_F32, 1, shape), 0);
    assert_int_equal(fy_st_writer_put_f32(w, "a", v, 1), 0);
    expect_line(overfill_fn, w, -EINVAL, p, "tensor \"a\"", "only 12 of its 16 remain");
    expect_line(undeclared_fn, w, -EINVAL, p, "tensor \"nope\" was not declared", NULL);
    expect_line(late_declare_fn, w, -EINVAL, p, "\"late\" declared after data", NULL);
    assert_int_equal(fy_st_writer_put_f32(w, "a", v + 1, 3), 0);
    assert_int_equal(fy_st_writer_finish(&w), 0);
    assert_int_equal(count_entries(tmpdir), 1);

    /* an existing file is kept unless overwrite */
    struct stat before, after;
    assert_int_equal(stat(p, &before), 0);
    expect_line(new_missing_dir_fn, (void *)p, -EEXIST, p, "already exists", NULL);
    assert_int_equal(fy_st_writer_new(&w, p, 1), 0);
    assert_int_equal(fy_st_writer_declare(w, "only", FY_ST_BF16, 0, NULL), 0);
    assert_int_equal(fy_st_writer_put_f32(w, "only", v, 1), 0);
    assert_int_equal(stat(p, &after), 0);
    assert_int_equal(after.st_size, before.st_size); /* untouched until finish */
    assert_int_equal(fy_st_writer_finish(&w), 0);
    struct fy_st_reader *r = NULL;
    assert_int_equal(fy_st_open(&r, p), 0);
    assert_int_equal(fy_st_count(r), 1);
    assert_string_equal(fy_st_tensor_at(r, 0)->name, "only");
    fy_st_destroy(&r);
    assert_int_equal(count_entries(tmpdir), 1);

    /* a sharded writer abandoned after writing into several shards leaves nothing */
    const char *dir = tpath("shd");
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(fy_st_writer_new_sharded(&w, dir, 16, 0), 0);
    assert_int_equal(fy_st_writer_declare(w, "a", FY_ST_F32, 1, shape), 0);
    assert_int_equal(fy_st_writer_declare(w, "b", FY_ST_F32, 1, shape), 0);
    assert_int_equal(fy_st_writer_put_f32(w, "a", v, 4), 0);
    assert_int_equal(fy_st_writer_put_f32(w, "b", v, 4), 0);
    assert_int_equal(count_entries(dir), 3); /* two shards and the index, all .tmp */
    fy_st_writer_destroy(&w);
    assert_int_equal(count_entries(dir), 0);
}

int main(void)
{
    if (fy_refmodel_script("safetensors_check.py", script, sizeof script) != 0) {
        printf("test_safetensors: cannot read %s (run from the repository root, or set FUYOU_SRC "
               "to it)\n", script);
        return 1;
    }
    have_python = fy_refmodel_python_has("json, struct");
    if (!have_python)
        printf("test_safetensors: python3 not found: the independent format checks are skipped\n");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32),
        cmocka_unit_test_setup_teardown(test_roundtrip_single, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_sharded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_python_written, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_headers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_atomic, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
