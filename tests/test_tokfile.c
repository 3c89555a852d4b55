/* Tests of token files (common/formats/tokfile): the on-disk format byte by byte, atomic writes,
 * byte-level preparation, every refusal of the reader, the loss mask and the tokenizer's identity,
 * a signal's stop flag (splits and batch sampling: test_tokbatch). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/base/log.h"
#include "common/formats/tokfile.h"
#include "common/formats/tokwriter.h"
#include "tests/testutil.h"

static char *tmpdir;

static int setup(void **state)
{
    tmpdir = fy_test_tmpdir("tokfile");
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

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void write_bytes(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (len > 0)
        assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* Number of directory entries other than . and .. */
static int count_entries(const char *dir)
{
    int n = fy_test_count_entries(dir);
    assert_true(n >= 0);
    return n;
}

static int has_tmp_file(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp") != NULL)
            found = 1;
    closedir(d);
    return found;
}

/* fy_test_capture_stderr, failing the test if stderr cannot be captured. */
static char *capture_stderr(int (*fn)(void *), void *arg, int *rc)
{
    char *text = fy_test_capture_stderr(fn, arg, rc);
    assert_non_null(text);
    return text;
}

struct open_case {
    const char *path;
    uint32_t model_vocab;
};

static int open_fn(void *arg)
{
    struct open_case *c = arg;
    struct fy_tokfile *t = (struct fy_tokfile *)1;
    int rc = fy_tokfile_open(&t, c->path, c->model_vocab);
    if (rc < 0)
        assert_null(t);
    fy_tokfile_destroy(&t);
    return rc;
}

/* Opening path must fail with code and log exactly one line containing the path and `want`. */
static void expect_open_refused(const char *path, uint32_t model_vocab, int code, const char *want)
{
    struct open_case c = {path, model_vocab};
    int rc = 0;
    char *log = capture_stderr(open_fn, &c, &rc);
    assert_int_equal(rc, code);
    assert_int_equal(fy_test_count_lines(log), 1);
    if (strstr(log, path) == NULL || strstr(log, want) == NULL)
        fail_msg("log '%s' lacks '%s' or '%s'", log, path, want);
    free(log);
}

/* A hand-made header; checksum fixed up unless bad_checksum. */
static void make_header(uint8_t *h, uint32_t magic, uint32_t version, uint32_t width,
                        uint32_t vocab, uint64_t count, uint32_t flags, int bad_checksum)
{
    memset(h, 0, FY_TOKFILE_HEADER_BYTES);
    put32(h + 0, magic);
    put32(h + 4, version);
    put32(h + 8, width);
    put32(h + 12, vocab);
    put32(h + 16, (uint32_t)count);
    put32(h + 20, (uint32_t)(count >> 32));
    put32(h + 24, flags);
    put32(h + 28, fy_tokfile_header_checksum(h) ^ (bad_checksum ? 1u : 0u));
}

/* A width-1 file of `ntok` tokens 0,1,2.. (mod 50) with the given header fields, cut to `size`
 * bytes (0: full). */
static const char *make_file(const char *name, uint32_t magic, uint32_t version, uint32_t width,
                             uint32_t vocab, uint64_t count, uint32_t flags, int bad_checksum,
                             size_t ntok, size_t size)
{
    static uint8_t buf[FY_TOKFILE_HEADER_BYTES + 8192];
    assert_true(ntok <= 8192);
    make_header(buf, magic, version, width, vocab, count, flags, bad_checksum);
    for (size_t i = 0; i < ntok; i++)
        buf[FY_TOKFILE_HEADER_BYTES + i] = (uint8_t)(i % 50);
    const char *p = tpath(name);
    write_bytes(p, buf, size ? size : FY_TOKFILE_HEADER_BYTES + ntok);
    return p;
}

/* ---- format and writer ---- */

static void roundtrip(uint32_t vocab, uint32_t want_width, uint64_t count)
{
    uint32_t *tok = malloc(count * sizeof *tok);
    assert_non_null(tok);
    uint64_t rs = vocab;
    for (uint64_t i = 0; i < count; i++)
        tok[i] = (uint32_t)(fy_test_rand(&rs) % vocab);
    tok[0] = vocab - 1;
    tok[count - 1] = 0;
    char name[64];
    snprintf(name, sizeof name, "rt%u.tok", vocab);
    const char *p = tpath(name);
    assert_int_equal(fy_tokfile_write(p, tok, count, vocab, 0), 0);

    /* the bytes on disk */
    size_t len = 0;
    uint8_t *b = (uint8_t *)fy_test_slurp(p, &len);
    assert_non_null(b);
    uint64_t data_end = FY_TOKFILE_HEADER_BYTES + count * want_width;
    assert_int_equal(len, (data_end + 4095) / 4096 * 4096);
    assert_int_equal(len % 4096, 0);
    assert_memory_equal(b, "FTOK", 4);
    assert_int_equal(le32(b + 0), 0x4B4F5446u);
    assert_int_equal(le32(b + 4), 1);
    assert_int_equal(le32(b + 8), want_width);
    assert_int_equal(le32(b + 12), vocab);
    assert_int_equal(le32(b + 16), (uint32_t)count);
    assert_int_equal(le32(b + 20), (uint32_t)(count >> 32));
    assert_int_equal(le32(b + 24), 0);
    assert_int_equal(le32(b + 28), fy_tokfile_header_checksum(b));
    for (size_t i = 32; i < FY_TOKFILE_HEADER_BYTES; i++)
        assert_int_equal(b[i], 0);
    for (uint64_t i = 0; i < count; i++) {
        const uint8_t *q = b + FY_TOKFILE_HEADER_BYTES + i * want_width;
        uint32_t v = 0;
        for (uint32_t k = 0; k < want_width; k++)
            v |= (uint32_t)q[k] << (8 * k);
        assert_int_equal(v, tok[i]);
    }
    for (uint64_t i = data_end; i < len; i++)
        assert_int_equal(b[i], 0);
    free(b);

    /* the reader */
    struct fy_tokfile *t = NULL;
    assert_int_equal(fy_tokfile_open(&t, p, vocab), 0);
    assert_int_equal(fy_tokfile_count(t), count);
    assert_int_equal(fy_tokfile_vocab(t), vocab);
    assert_int_equal(fy_tokfile_width(t), want_width);
    for (uint64_t i = 0; i < count; i++)
        assert_int_equal(fy_tokfile_token(t, i), tok[i]);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_TRAIN), count);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL), 0);
    fy_tokfile_destroy(&t);
    assert_null(t);
    fy_tokfile_destroy(&t); /* safe twice */
    /* a larger model vocabulary, and no model */
    assert_int_equal(fy_tokfile_open(&t, p, vocab + 1000), 0);
    fy_tokfile_destroy(&t);
    assert_int_equal(fy_tokfile_open(&t, p, 0), 0);
    fy_tokfile_destroy(&t);
    free(tok);
}

static void test_roundtrip_widths(void **state)
{
    roundtrip(256, 1, 5000);
    roundtrip(60000, 2, 3001);
    roundtrip(100000, 4, 1023); /* exactly fills 4092 data bytes: padding of 4 */
    roundtrip(65536, 2, 7);
    roundtrip(257, 2, 2048); /* data ends on a 4 KiB boundary: no padding */
    roundtrip(1, 1, 1);
    assert_false(has_tmp_file(tmpdir));
}

static int write_refused_fn(void *arg)
{
    static const uint32_t tok[] = {1, 2, 3, 300, 4};
    return fy_tokfile_write(arg, tok, 5, 256, 0);
}

static void test_write_atomic_and_refusals(void **state)
{
    const char *p = tpath("w.tok");
    uint32_t a[] = {1, 2, 3}, b[] = {7, 8, 9, 10};

    /* a token outside the vocabulary is named and nothing is created */
    int rc = 0;
    char *log = capture_stderr(write_refused_fn, (void *)p, &rc);
    assert_int_equal(rc, -EINVAL);
    assert_non_null(strstr(log, "token 300 at index 3"));
    assert_non_null(strstr(log, p));
    free(log);
    assert_int_equal(access(p, F_OK), -1);
    assert_int_equal(count_entries(tmpdir), 0);

    assert_int_equal(fy_tokfile_write(p, a, 0, 256, 0), -EINVAL);
    assert_int_equal(fy_tokfile_write(p, a, 3, 0, 0), -EINVAL);
    assert_int_equal(fy_tokfile_write(p, a, 3, 0x80000000u, 0), -EINVAL);
    assert_int_equal(count_entries(tmpdir), 0);

    assert_int_equal(fy_tokfile_write(p, a, 3, 256, 0), 0);
    assert_int_equal(count_entries(tmpdir), 1);
    assert_false(has_tmp_file(tmpdir));

    /* an existing file is refused without overwrite and left alone */
    size_t len0 = 0, len1 = 0;
    char *before = fy_test_slurp(p, &len0);
    int saved = dup(STDERR_FILENO);
    int cfd = open(tpath("err.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && cfd >= 0);
    dup2(cfd, STDERR_FILENO);
    rc = fy_tokfile_write(p, b, 4, 256, 0);
    dup2(saved, STDERR_FILENO);
    close(saved);
    close(cfd);
    assert_int_equal(rc, -EEXIST);
    log = fy_test_slurp(tpath("err.txt"), NULL);
    assert_non_null(strstr(log, "remove it or pass --overwrite"));
    assert_non_null(strstr(log, p));
    assert_int_equal(fy_test_count_lines(log), 1);
    free(log);
    unlink(tpath("err.txt"));
    char *after = fy_test_slurp(p, &len1);
    assert_int_equal(len0, len1);
    assert_memory_equal(before, after, len0);
    free(after);

    /* and replaced with it */
    assert_int_equal(fy_tokfile_write(p, b, 4, 256, 1), 0);
    assert_false(has_tmp_file(tmpdir));
    assert_int_equal(count_entries(tmpdir), 1);
    struct fy_tokfile *t = NULL;
    assert_int_equal(fy_tokfile_open(&t, p, 256), 0);
    assert_int_equal(fy_tokfile_count(t), 4);
    for (int i = 0; i < 4; i++)
        assert_int_equal(fy_tokfile_token(t, (uint64_t)i), b[i]);
    fy_tokfile_destroy(&t);
    free(before);

    /* a stale .tmp from a crashed run does not get in the way */
    write_bytes(tpath("w2.tok.tmp"), "junk", 4);
    assert_int_equal(fy_tokfile_write(tpath("w2.tok"), a, 3, 256, 0), 0);
    assert_false(has_tmp_file(tmpdir));

    /* a missing directory */
    assert_int_equal(fy_tokfile_write(tpath("nodir/x.tok"), a, 3, 256, 0), -ENOENT);
    unlink(p);
    unlink(tpath("w2.tok"));
}

/* ---- byte-level preparation ---- */

struct prep_case {
    const char *out;
    const char *const *in;
    unsigned n;
    int overwrite;
};

static int prep_fn(void *arg)
{
    struct prep_case *c = arg;
    return fy_tokfile_prepare_bytes(c->out, c->in, c->n, c->overwrite, NULL);
}

static void expect_prep_refused(struct prep_case *c, int code, const char *want, const char *want2)
{
    int rc = 0;
    char *log = capture_stderr(prep_fn, c, &rc);
    assert_int_equal(rc, code);
    assert_int_equal(fy_test_count_lines(log), 1);
    if (strstr(log, want) == NULL || (want2 && strstr(log, want2) == NULL))
        fail_msg("log '%s' lacks '%s' / '%s'", log, want, want2 ? want2 : "");
    free(log);
}

static void test_prepare_bytes(void **state)
{
    const char *t1 = "Hello, world!\nsecond line\n";
    /* all 256 byte values, so nothing is lost or sign-extended */
    uint8_t t2[300];
    for (int i = 0; i < 300; i++)
        t2[i] = (uint8_t)(255 - i % 256);
    char in1[1024], in2[1024];
    snprintf(in1, sizeof in1, "%s", tpath("a.txt"));
    snprintf(in2, sizeof in2, "%s", tpath("b.bin"));
    write_bytes(in1, t1, strlen(t1));
    write_bytes(in2, t2, sizeof t2);
    const char *inputs[] = {in1, in2};
    const char *out = tpath("prep.tok");
    uint64_t n = 0;
    assert_int_equal(fy_tokfile_prepare_bytes(out, inputs, 2, 0, &n), 0);
    assert_int_equal(n, strlen(t1) + sizeof t2);
    assert_false(has_tmp_file(tmpdir));

    struct fy_tokfile *t = NULL;
    assert_int_equal(fy_tokfile_open(&t, out, 50257), 0);
    assert_int_equal(fy_tokfile_count(t), n);
    assert_int_equal(fy_tokfile_vocab(t), 256);
    assert_int_equal(fy_tokfile_width(t), 1);
    /* each input a document (text files, not records), the byte-level tokenizer recorded */
    assert_int_equal(fy_tokfile_version(t), 3);
    assert_int_equal(fy_tokfile_source(t).tokenizer, FY_TOKENIZER_BYTES);
    assert_int_equal(fy_tokfile_documents(t), 2);
    assert_int_equal(fy_tokfile_documents_are_records(t), 0);
    assert_int_equal(fy_tokfile_document_start(t, 0), 0);
    assert_int_equal(fy_tokfile_document_end(t, 0), strlen(t1));
    assert_int_equal(fy_tokfile_document_start(t, 1), strlen(t1));
    assert_int_equal(fy_tokfile_document_end(t, 1), n);
    for (size_t i = 0; i < strlen(t1); i++)
        assert_int_equal(fy_tokfile_token(t, i), (uint8_t)t1[i]);
    for (size_t i = 0; i < sizeof t2; i++)
        assert_int_equal(fy_tokfile_token(t, strlen(t1) + i), t2[i]);
    fy_tokfile_destroy(&t);

    /* a model with a vocabulary smaller than 256 cannot use byte tokens */
    expect_open_refused(out, 100, -ERANGE, "made for vocabulary 256, the model has 100");

    /* the output exists */
    struct prep_case c = {out, inputs, 2, 0};
    expect_prep_refused(&c, -EEXIST, "remove it or pass --overwrite", out);
    /* same inputs in the other order, overwriting */
    const char *swapped[] = {in2, in1};
    c.in = swapped;
    c.overwrite = 1;
    assert_int_equal(prep_fn(&c), 0);
    assert_int_equal(fy_tokfile_open(&t, out, 256), 0);
    assert_int_equal(fy_tokfile_token(t, 0), 255);
    assert_int_equal(fy_tokfile_token(t, sizeof t2), 'H');
    fy_tokfile_destroy(&t);

    /* a directory, a missing file, no inputs, empty inputs: refused naming them, nothing made */
    const char *out2 = tpath("prep2.tok");
    const char *with_dir[] = {in1, tmpdir};
    c = (struct prep_case){out2, with_dir, 2, 0};
    expect_prep_refused(&c, -EISDIR, tmpdir, "directory");
    const char *with_missing[] = {in1, tpath("missing.txt")};
    c.in = with_missing;
    expect_prep_refused(&c, -ENOENT, "missing.txt", "cannot read input");
    c.n = 0;
    expect_prep_refused(&c, -EINVAL, "no input files", NULL);
    write_bytes(tpath("empty1.txt"), "", 0);
    write_bytes(tpath("empty2.txt"), "", 0);
    char e1[1024], e2[1024];
    snprintf(e1, sizeof e1, "%s", tpath("empty1.txt"));
    snprintf(e2, sizeof e2, "%s", tpath("empty2.txt"));
    const char *empties[] = {e1, e2};
    c = (struct prep_case){out2, empties, 2, 0};
    expect_prep_refused(&c, -EINVAL, "empty", out2);
    assert_int_equal(access(out2, F_OK), -1);
    assert_false(has_tmp_file(tmpdir));
    /* an empty input among others is fine, and no document */
    const char *mixed[] = {e1, in1, e2};
    assert_int_equal(fy_tokfile_prepare_bytes(out2, mixed, 3, 0, &n), 0);
    assert_int_equal(n, strlen(t1));
    assert_int_equal(fy_tokfile_open(&t, out2, 256), 0);
    assert_int_equal(fy_tokfile_documents(t), 1);
    fy_tokfile_destroy(&t);
    /* an unreadable input (skipped when running as root, who can read anything) */
    if (geteuid() != 0) {
        assert_int_equal(chmod(in1, 0), 0);
        const char *unreadable[] = {in1};
        c = (struct prep_case){tpath("prep3.tok"), unreadable, 1, 0};
        expect_prep_refused(&c, -EACCES, in1, NULL);
        chmod(in1, 0644);
    }
    /* a larger input that spans several read chunks */
    size_t big = (3u << 20) + 12345;
    uint8_t *bb = malloc(big);
    assert_non_null(bb);
    uint64_t rs = 99;
    for (size_t i = 0; i < big; i++)
        bb[i] = (uint8_t)fy_test_rand(&rs);
    char bigp[1024];
    snprintf(bigp, sizeof bigp, "%s", tpath("big.bin"));
    write_bytes(bigp, bb, big);
    const char *bigin[] = {bigp, in1};
    assert_int_equal(fy_tokfile_prepare_bytes(tpath("big.tok"), bigin, 2, 0, &n), 0);
    assert_int_equal(n, big + strlen(t1));
    assert_int_equal(fy_tokfile_open(&t, tpath("big.tok"), 256), 0);
    for (size_t i = 0; i < big; i++)
        if (fy_tokfile_token(t, i) != bb[i])
            fail_msg("byte %zu differs", i);
    assert_int_equal(fy_tokfile_token(t, big), 'H');
    fy_tokfile_destroy(&t);
    free(bb);
}

/* ---- reader refusals ---- */

static void test_open_refusals(void **state)
{
    const uint32_t M = FY_TOKFILE_MAGIC;
    expect_open_refused(tpath("nope.tok"), 256, -ENOENT, "cannot open token file");
    expect_open_refused(tmpdir, 256, -EINVAL, "not a regular file");

    const char *p = make_file("short.tok", M, 1, 1, 256, 10, 0, 0, 0, 100);
    expect_open_refused(p, 256, -EBADMSG, "shorter than the 4096-byte header");
    write_bytes(p, "", 0);
    expect_open_refused(p, 256, -EBADMSG, "shorter than");

    p = make_file("magic.tok", 0x12345678, 1, 1, 256, 10, 0, 0, 10, 0);
    expect_open_refused(p, 256, -EBADMSG,
                        "not a Fuyou token file: prepare it with fuyou-launch prepare");
    p = make_file("version.tok", M, 4, 1, 256, 10, 0, 0, 10, 0);
    expect_open_refused(p, 256, -EBADMSG, "version 4, this build reads versions 1 to 3");
    p = make_file("width.tok", M, 1, 3, 256, 10, 0, 0, 30, 0);
    expect_open_refused(p, 256, -EBADMSG, "bad token width 3");
    p = make_file("width0.tok", M, 1, 0, 256, 10, 0, 0, 30, 0);
    expect_open_refused(p, 256, -EBADMSG, "bad token width 0");
    p = make_file("sum.tok", M, 1, 1, 256, 10, 0, 1, 10, 0);
    expect_open_refused(p, 256, -EBADMSG, "bad header checksum");
    p = make_file("flags.tok", M, 1, 1, 256, 10, FY_TOKFILE_FLAG_LOSS_MASK, 0, 20, 0);
    expect_open_refused(p, 256, -ENOTSUP, "loss-mask");
    p = make_file("flags2.tok", M, 1, 1, 256, 10, 4, 0, 20, 0);
    expect_open_refused(p, 256, -ENOTSUP, "unknown flags 0x4");
    p = make_file("count0.tok", M, 1, 1, 256, 0, 0, 0, 0, 0);
    expect_open_refused(p, 256, -EBADMSG, "no tokens");
    p = make_file("vocab0.tok", M, 1, 1, 0, 10, 0, 0, 10, 0);
    expect_open_refused(p, 256, -EBADMSG, "bad vocabulary size 0");

    p = make_file("trunc.tok", M, 1, 1, 256, 100, 0, 0, 50, 0);
    expect_open_refused(p, 256, -EBADMSG, "truncated: expected 4196 bytes, found 4146");
    p = make_file("trunc2.tok", M, 1, 2, 1000, 100, 0, 0, 150, 0);
    expect_open_refused(p, 1000, -EBADMSG, "truncated: expected 4296 bytes, found 4246");
    /* the count's high word counts */
    p = make_file("trunc3.tok", M, 1, 1, 256, (1ull << 32) + 5, 0, 0, 4096, 0);
    expect_open_refused(p, 256, -EBADMSG, "truncated: expected 4294971397 bytes, found 8192");

    p = make_file("vocab.tok", M, 1, 2, 1000, 10, 0, 0, 20, 0);
    expect_open_refused(p, 500, -ERANGE, "made for vocabulary 1000, the model has 500");

    /* a token beyond the model's vocabulary (header claims a vocabulary the model accepts) */
    static uint8_t buf[FY_TOKFILE_HEADER_BYTES + 200000];
    make_header(buf, M, 1, 1, 100, 200000, 0, 0);
    for (size_t i = 0; i < 200000; i++)
        buf[FY_TOKFILE_HEADER_BYTES + i] = (uint8_t)(i % 90);
    buf[FY_TOKFILE_HEADER_BYTES + 150007] = 150; /* in a later scan block */
    buf[FY_TOKFILE_HEADER_BYTES + 150100] = 110;
    p = tpath("badtok.tok");
    write_bytes(p, buf, sizeof buf);
    expect_open_refused(p, 120, -ERANGE,
                        "token 150 at index 150007 is outside the model's vocabulary of 120");
    expect_open_refused(p, 0, -EBADMSG,
                        "token 150 at index 150007 is outside the file's vocabulary of 100");
    /* below the model's vocabulary but not the file's own: the file is corrupt */
    buf[FY_TOKFILE_HEADER_BYTES + 150007] = 1;
    write_bytes(p, buf, sizeof buf);
    expect_open_refused(p, 120, -EBADMSG,
                        "token 110 at index 150100 is outside the file's vocabulary of 100");
    buf[FY_TOKFILE_HEADER_BYTES + 150100] = 1;
    write_bytes(p, buf, sizeof buf);
    struct fy_tokfile *t = NULL;
    assert_int_equal(fy_tokfile_open(&t, p, 120), 0);
    assert_int_equal(fy_tokfile_count(t), 200000);
    fy_tokfile_destroy(&t);

    /* width 4: a token past the model vocabulary in the high bytes */
    uint32_t tok[5] = {1, 2, 3, 4, 5};
    p = tpath("w4.tok");
    assert_int_equal(fy_tokfile_write(p, tok, 5, 100000, 0), 0);
    size_t len = 0;
    uint8_t *b = (uint8_t *)fy_test_slurp(p, &len);
    put32(b + FY_TOKFILE_HEADER_BYTES + 4 * 3, 99999);
    write_bytes(p, b, len);
    free(b);
    expect_open_refused(p, 99999, -ERANGE, "made for vocabulary 100000, the model has 99999");
    assert_int_equal(fy_tokfile_open(&t, p, 100000), 0);
    assert_int_equal(fy_tokfile_token(t, 3), 99999);
    fy_tokfile_destroy(&t);
}

/* ---- version 2: loss mask and tokenizer identity ---- */

static uint8_t *slurp_file(const char *path, size_t *len)
{
    uint8_t *b = (uint8_t *)fy_test_slurp(path, len);
    assert_non_null(b);
    return b;
}

/* Rewrites slot `slot` of a version 2 file and fixes its checksum. */
static void patch_v2(const char *from, const char *to, int slot, uint32_t value, size_t cut)
{
    size_t len;
    uint8_t *b = slurp_file(from, &len);
    if (slot >= 0)
        put32(b + 4 * slot, value);
    put32(b + 4 * FY_TOKFILE_V2_SLOT_CHECKSUM, fy_tokfile_header_checksum_v2(b));
    write_bytes(to, b, cut ? cut : len);
    free(b);
}

static void test_masked_format(void **state)
{
    enum { N = 900, V = 1000 };
    uint32_t tok[N];
    uint8_t tr[N];
    for (int i = 0; i < N; i++) {
        tok[i] = (uint32_t)i; /* unique: a window's start is its first input */
        tr[i] = (i / 7) % 3 != 0;
    }
    uint64_t masked = 0;
    for (int i = 0; i < N; i++)
        masked += !tr[i];
    struct fy_tokfile_source src = {FY_TOKENIZER_HF, 0x0123456789abcdefull, 999, NULL};
    const char *p = tpath("m.tok");
    assert_int_equal(fy_tokfile_write_masked(p, tok, tr, N, V, &src, 0), 0);

    /* the bytes: header slots, tokens, the mask plane at the next 4 KiB boundary */
    size_t len;
    uint8_t *b = slurp_file(p, &len);
    uint64_t mask_off = FY_TOKFILE_HEADER_BYTES + 4096; /* 1800 token bytes, padded */
    assert_int_equal(len, mask_off + 4096);
    assert_int_equal(le32(b + 4), 2);
    assert_int_equal(le32(b + 8), 2);
    assert_int_equal(le32(b + 12), V);
    assert_int_equal(le32(b + 16), N);
    assert_int_equal(le32(b + 24), FY_TOKFILE_FLAG_LOSS_MASK);
    assert_int_equal(le32(b + 28), FY_TOKENIZER_HF);
    assert_int_equal(le32(b + 32), 0x89abcdefu);
    assert_int_equal(le32(b + 36), 0x01234567u);
    assert_int_equal(le32(b + 40), 999);
    assert_int_equal(le32(b + 44), masked);
    assert_int_equal(le32(b + 48), 0);
    assert_int_equal(le32(b + 52), fy_tokfile_header_checksum_v2(b));
    for (int i = 0; i < N; i++) {
        assert_int_equal(b[FY_TOKFILE_HEADER_BYTES + 2 * i] | b[FY_TOKFILE_HEADER_BYTES + 2 * i + 1] << 8, i);
        assert_int_equal(b[mask_off + i / 8] >> (i % 8) & 1, tr[i]);
    }
    for (size_t i = mask_off + (N + 7) / 8; i < len; i++)
        assert_int_equal(b[i], 0);
    free(b);

    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, p, V), 0);
    assert_int_equal(fy_tokfile_version(t), 2);
    assert_int_equal(fy_tokfile_masked(t), masked);
    struct fy_tokfile_source got = fy_tokfile_source(t);
    assert_int_equal(got.tokenizer, FY_TOKENIZER_HF);
    assert_true(got.hash == src.hash);
    assert_int_equal(got.eos, 999);
    assert_null(got.name);
    for (int i = 0; i < N; i++)
        assert_int_equal(fy_tokfile_trained(t, (uint64_t)i), tr[i]);
    /* batches: a masked token's target is -1, inputs are untouched */
    assert_int_equal(fy_tokfile_split(t, 0.2), 0);
    enum { B = 5, T = 30 };
    int32_t in[B * T], tg[B * T];
    int seen_masked = 0, seen_trained = 0;
    for (uint64_t step = 0; step < 20; step++) {
        for (int split = 0; split < 2; split++) {
            if (split == FY_TOKFILE_TRAIN)
                assert_int_equal(fy_tokfile_batch(t, split, 3, step, B, T, in, tg), 0);
            else
                assert_int_equal(fy_tokfile_eval_batch(t, step, B, T, in, tg), 0);
            for (int r = 0; r < B; r++)
                for (int j = 0; j < T; j++) {
                    int start = in[r * T], next = start + j + 1;
                    assert_int_equal(in[r * T + j], start + j);
                    assert_int_equal(tg[r * T + j], tr[next] ? next : -1);
                    seen_masked += !tr[next];
                    seen_trained += tr[next];
                }
        }
    }
    assert_true(seen_masked > 0 && seen_trained > 0);
    fy_tokfile_destroy(&t);

    /* the vocabulary check names the file's tokenizer */
    expect_open_refused(p, 998, -ERANGE,
                        "made for vocabulary 1000, the model has 998 (the file's: Hugging Face "
                        "tokenizer.json 0123456789abcdef)");

    /* no masked token: no plane (version 2 for the identity); no identity either: version 1 */
    memset(tr, 1, sizeof tr);
    assert_int_equal(fy_tokfile_write_masked(tpath("all.tok"), tok, tr, N, V, &src, 0), 0);
    b = slurp_file(tpath("all.tok"), &len);
    assert_int_equal(len, FY_TOKFILE_HEADER_BYTES + 4096);
    assert_int_equal(le32(b + 4), 2);
    assert_int_equal(le32(b + 24), 0);
    assert_int_equal(le32(b + 44), 0);
    free(b);
    assert_int_equal(fy_tokfile_write_masked(tpath("plain.tok"), tok, tr, N, V, NULL, 0), 0);
    b = slurp_file(tpath("plain.tok"), &len);
    assert_int_equal(le32(b + 4), 1);
    assert_int_equal(le32(b + 28), fy_tokfile_header_checksum(b));
    free(b);
    assert_int_equal(fy_tokfile_open(&t, tpath("plain.tok"), V), 0);
    assert_int_equal(fy_tokfile_source(t).tokenizer, FY_TOKENIZER_UNSPECIFIED);
    assert_int_equal(fy_tokfile_trained(t, 5), 1);
    assert_int_equal(fy_tokfile_documents(t), 0); /* versions 1 and 2: one stream */
    fy_tokfile_destroy(&t);
    assert_int_equal(fy_tokfile_open(&t, p, V), 0);
    assert_int_equal(fy_tokfile_documents(t), 0);
    assert_int_equal(fy_tokfile_split_documents(t, 0.1), -EINVAL);
    fy_tokfile_destroy(&t);

    /* every token masked: refused, nothing left */
    memset(tr, 0, sizeof tr);
    assert_int_equal(fy_tokfile_write_masked(tpath("none.tok"), tok, tr, N, V, &src, 0), -EINVAL);
    assert_int_equal(access(tpath("none.tok"), F_OK), -1);
    assert_int_equal(access(tpath("none.tok.tmp"), F_OK), -1);
    /* an EOS outside the vocabulary: refused */
    struct fy_tokfile_source bad_eos = {FY_TOKENIZER_HF, 1, V, NULL};
    assert_int_equal(fy_tokfile_write_masked(tpath("eos.tok"), tok, NULL, N, V, &bad_eos, 0),
                     -EINVAL);
}

/* The tokenizer's path, where the writer is given it: bytes 64.. of a version 2 header, NUL
 * terminated, outside the checksum; read back, named by the vocabulary refusal; not recorded when
 * it does not fit; ignored by the reader without its NUL or with a control character. */
static void test_tokenizer_name(void **state)
{
    enum { N = 40, V = 500 };
    uint32_t tok[N];
    for (int i = 0; i < N; i++)
        tok[i] = (uint32_t)(i * 11);
    const char *name = "/models/tiny/tokenizer.json";
    struct fy_tokfile_source src = {FY_TOKENIZER_HF, 0xfeedull, FY_TOKFILE_NO_EOS, name};
    const char *p = tpath("named.tok");
    assert_int_equal(fy_tokfile_write_masked(p, tok, NULL, N, V, &src, 0), 0);
    size_t len;
    uint8_t *b = slurp_file(p, &len);
    assert_int_equal(le32(b + 4), 2);
    assert_string_equal((const char *)b + FY_TOKFILE_NAME_OFFSET, name);
    for (size_t i = FY_TOKFILE_NAME_OFFSET + strlen(name); i < FY_TOKFILE_HEADER_BYTES; i++)
        assert_int_equal(b[i], 0);
    assert_int_equal(le32(b + 52), fy_tokfile_header_checksum_v2(b));
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, p, V), 0);
    assert_non_null(fy_tokfile_source(t).name);
    assert_string_equal(fy_tokfile_source(t).name, name);
    fy_tokfile_destroy(&t);
    expect_open_refused(p, 400, -ERANGE,
                        "(the file's: Hugging Face tokenizer.json 000000000000feed "
                        "(/models/tiny/tokenizer.json))");
    /* without its NUL, or with a control character: no name */
    memset(b + FY_TOKFILE_NAME_OFFSET, 'x', FY_TOKFILE_NAME_MAX);
    write_bytes(tpath("nonul.tok"), b, len);
    assert_int_equal(fy_tokfile_open(&t, tpath("nonul.tok"), V), 0);
    assert_null(fy_tokfile_source(t).name);
    fy_tokfile_destroy(&t);
    memset(b + FY_TOKFILE_NAME_OFFSET, 0, FY_TOKFILE_NAME_MAX);
    memcpy(b + FY_TOKFILE_NAME_OFFSET, "bad\nname", 8);
    write_bytes(tpath("ctl.tok"), b, len);
    assert_int_equal(fy_tokfile_open(&t, tpath("ctl.tok"), V), 0);
    assert_null(fy_tokfile_source(t).name);
    fy_tokfile_destroy(&t);
    free(b);
    /* a path that does not fit: not recorded */
    char longname[FY_TOKFILE_NAME_MAX + 1];
    memset(longname, 'a', sizeof longname - 1);
    longname[FY_TOKFILE_NAME_MAX] = 0;
    src.name = longname;
    assert_int_equal(fy_tokfile_write_masked(tpath("long.tok"), tok, NULL, N, V, &src, 0), 0);
    assert_int_equal(fy_tokfile_open(&t, tpath("long.tok"), V), 0);
    assert_null(fy_tokfile_source(t).name);
    assert_true(fy_tokfile_source(t).hash == 0xfeedull);
    fy_tokfile_destroy(&t);
    longname[FY_TOKFILE_NAME_MAX - 1] = 0; /* 1023 bytes and the NUL: recorded */
    assert_int_equal(fy_tokfile_write_masked(tpath("long.tok"), tok, NULL, N, V, &src, 1), 0);
    assert_int_equal(fy_tokfile_open(&t, tpath("long.tok"), V), 0);
    assert_non_null(fy_tokfile_source(t).name);
    assert_int_equal(strlen(fy_tokfile_source(t).name), FY_TOKFILE_NAME_MAX - 1);
    fy_tokfile_destroy(&t);
}

static void test_masked_refusals(void **state)
{
    enum { N = 21, V = 256 };
    uint32_t tok[N];
    uint8_t tr[N];
    for (int i = 0; i < N; i++)
        tok[i] = (uint32_t)i, tr[i] = i % 2;
    struct fy_tokfile_source src = {FY_TOKENIZER_BYTES, 0, FY_TOKFILE_NO_EOS, NULL};
    const char *good = tpath("good.tok");
    assert_int_equal(fy_tokfile_write_masked(good, tok, tr, N, V, &src, 0), 0);
    const uint64_t mask_off = 2 * FY_TOKFILE_HEADER_BYTES;

    patch_v2(good, tpath("count.tok"), FY_TOKFILE_SLOT_MASKED_LO, 9, 0);
    expect_open_refused(tpath("count.tok"), V, -EBADMSG, "the mask plane has 11 masked tokens, the header says 9");
    patch_v2(good, tpath("nomask.tok"), FY_TOKFILE_SLOT_FLAGS, 0, 0);
    expect_open_refused(tpath("nomask.tok"), V, -EBADMSG, "11 masked tokens but no mask plane");
    patch_v2(good, tpath("zero.tok"), FY_TOKFILE_SLOT_MASKED_LO, 0, 0);
    expect_open_refused(tpath("zero.tok"), V, -EBADMSG, "a mask plane needs at least one masked");
    patch_v2(good, tpath("kind.tok"), FY_TOKFILE_SLOT_TOKENIZER, 3, 0);
    expect_open_refused(tpath("kind.tok"), V, -ENOTSUP, "unknown tokenizer kind 3");
    patch_v2(good, tpath("eos.tok"), FY_TOKFILE_SLOT_EOS, 256, 0);
    expect_open_refused(tpath("eos.tok"), V, -EBADMSG, "end-of-sequence token 256 outside");
    patch_v2(good, tpath("trunc.tok"), -1, 0, mask_off + 2);
    expect_open_refused(tpath("trunc.tok"), V, -EBADMSG, "truncated: expected 8195 bytes, found 8194");
    patch_v2(good, tpath("sum.tok"), -1, 0, 0);
    size_t len;
    uint8_t *b = slurp_file(tpath("sum.tok"), &len);
    b[mask_off + 2] |= 0x80; /* token 23 does not exist */
    write_bytes(tpath("tail.tok"), b, len);
    expect_open_refused(tpath("tail.tok"), V, -EBADMSG, "mask bits set after the last token");
    put32(b + 52, le32(b + 52) ^ 1);
    write_bytes(tpath("sum.tok"), b, len);
    expect_open_refused(tpath("sum.tok"), V, -EBADMSG, "bad header checksum");
    free(b);
}

/* A stop flag (a signal handler's, fy_tokwriter_stop_on): the byte-level preparation and a
 * streaming writer stop at their next write with -EINTR and leave no file; cleared, they write. */
static void test_stop_flag(void **state)
{
    static volatile sig_atomic_t stop;
    fy_tokwriter_stop_on(&stop);
    char in[1024];
    snprintf(in, sizeof in, "%s", tpath("stop.txt"));
    write_bytes(in, "some text", 9);
    const char *inputs[] = {in};
    stop = SIGINT;
    assert_int_equal(fy_tokfile_prepare_bytes(tpath("stop.tok"), inputs, 1, 0, NULL), -EINTR);
    assert_int_equal(access(tpath("stop.tok"), F_OK), -1);
    assert_false(has_tmp_file(tmpdir));
    /* a streaming writer stopped after it began: its next flush (a full 1 MiB buffer) */
    stop = 0;
    struct fy_tokwriter *w;
    assert_int_equal(fy_tokwriter_begin(&w, tpath("stop2.tok"), 300, NULL, 0), 0);
    uint32_t *tokens = calloc(1u << 20, sizeof *tokens);
    assert_non_null(tokens);
    assert_int_equal(fy_tokwriter_put(w, tokens, 1000, 1), 0);
    stop = SIGTERM;
    assert_int_equal(fy_tokwriter_put(w, tokens, 1u << 20, 1), -EINTR);
    fy_tokwriter_abort(&w);
    assert_int_equal(access(tpath("stop2.tok"), F_OK), -1);
    assert_false(has_tmp_file(tmpdir));
    stop = 0;
    uint64_t n = 0;
    assert_int_equal(fy_tokfile_prepare_bytes(tpath("stop.tok"), inputs, 1, 0, &n), 0);
    assert_int_equal(n, 9);
    fy_tokwriter_stop_on(NULL);
    free(tokens);
}

static void test_streaming_writer(void **state)
{
    /* more mask bits than the writer holds in memory (8 Mi), so they go through its side file */
    const uint64_t n = 9000001;
    const char *p = tpath("stream.tok");
    struct fy_tokwriter *w;
    struct fy_tokfile_source src = {FY_TOKENIZER_HF, 42, 7, NULL};
    assert_int_equal(fy_tokwriter_begin(&w, p, 300, &src, 0), 0);
    assert_int_equal(access(p, F_OK), -1); /* nothing before finish */
    uint32_t *chunk = malloc(4096 * sizeof *chunk);
    assert_non_null(chunk);
    uint64_t done = 0, masked = 0;
    for (unsigned k = 0; done < n; k++) {
        /* runs of 1..4096 tokens, alternately trained and masked (masked ones shorter) */
        uint64_t len = 1 + (k * 2654435761u) % (k % 2 ? 700 : 4096);
        if (len > n - done)
            len = n - done;
        for (uint64_t i = 0; i < len; i++)
            chunk[i] = (uint32_t)((done + i) % 300);
        assert_int_equal(fy_tokwriter_put(w, chunk, len, k % 2 == 0), 0);
        masked += k % 2 ? len : 0;
        done += len;
    }
    assert_int_equal(fy_tokwriter_count(w), n);
    chunk[0] = 300;
    assert_int_equal(fy_tokwriter_put(w, chunk, 1, 1), -EINVAL); /* outside the vocabulary */
    uint64_t count, got_masked;
    assert_int_equal(fy_tokwriter_finish(&w, &count, &got_masked), 0);
    assert_null(w);
    assert_int_equal(count, n);
    assert_int_equal(got_masked, masked);
    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, p, 300), 0);
    assert_int_equal(fy_tokfile_count(t), n);
    assert_int_equal(fy_tokfile_masked(t), masked);
    /* replay the runs */
    done = 0;
    int bad = 0;
    for (unsigned k = 0; done < n; k++) {
        uint64_t len = 1 + (k * 2654435761u) % (k % 2 ? 700 : 4096);
        if (len > n - done)
            len = n - done;
        for (uint64_t i = done; i < done + len; i++)
            bad += fy_tokfile_trained(t, i) != (k % 2 == 0) || fy_tokfile_token(t, i) != i % 300;
        done += len;
    }
    assert_int_equal(bad, 0);
    fy_tokfile_destroy(&t);
    free(chunk);

    /* abort and an empty finish leave nothing */
    assert_int_equal(fy_tokwriter_begin(&w, tpath("ab.tok"), 300, &src, 0), 0);
    uint32_t one = 1;
    assert_int_equal(fy_tokwriter_put(w, &one, 1, 1), 0);
    fy_tokwriter_abort(&w);
    assert_null(w);
    fy_tokwriter_abort(&w); /* safe on NULL */
    assert_int_equal(access(tpath("ab.tok"), F_OK), -1);
    assert_int_equal(access(tpath("ab.tok.tmp"), F_OK), -1);
    assert_int_equal(fy_tokwriter_begin(&w, tpath("ab.tok"), 300, &src, 0), 0);
    assert_int_equal(fy_tokwriter_finish(&w, NULL, NULL), -EINVAL);
    assert_int_equal(access(tpath("ab.tok"), F_OK), -1);
    assert_int_equal(access(tpath("ab.tok.tmp"), F_OK), -1);
    /* the existing file is refused before anything */
    assert_int_equal(fy_tokwriter_begin(&w, p, 300, &src, 0), -EEXIST);

    /* the tokenizer hash: 64-bit FNV-1a */
    write_bytes(tpath("a.txt"), "a", 1);
    uint64_t h;
    assert_int_equal(fy_tokfile_hash_file(tpath("a.txt"), &h), 0);
    assert_true(h == 0xaf63dc4c8601ec8cull);
}

/* ---- version 3: the document index ---- */

/* Rewrites slot `slot` of a version 3 file and fixes its checksum; or the 8 bytes at `at` (> 0). */
static void patch_v3(const char *from, const char *to, int slot, uint32_t value, size_t at,
                     uint64_t value64, size_t cut)
{
    size_t len;
    uint8_t *b = slurp_file(from, &len);
    if (slot >= 0)
        put32(b + 4 * slot, value);
    if (at > 0) {
        put32(b + at, (uint32_t)value64);
        put32(b + at + 4, (uint32_t)(value64 >> 32));
    }
    put32(b + 4 * FY_TOKFILE_V3_SLOT_CHECKSUM, fy_tokfile_header_checksum_v3(b));
    write_bytes(to, b, cut ? cut : len);
    free(b);
}

/* The streaming writer told of documents writes version 3: the index after the mask plane, each
 * document's first token, no empty document for two calls in a row, the tokens before the first
 * call a document of their own; read back; every corruption of it refused. */
static void test_document_index(void **state)
{
    enum { V = 1000 };
    const char *p = tpath("docs.tok");
    struct fy_tokwriter *w;
    struct fy_tokfile_source src = {FY_TOKENIZER_HF, 5, 2, NULL};
    assert_int_equal(fy_tokwriter_begin(&w, p, V, &src, 0), 0);
    uint32_t tok[10] = {10, 11, 12, 20, 21, 22, 23, 30, 31, 32};
    assert_int_equal(fy_tokwriter_document(w, 1), 0);
    assert_int_equal(fy_tokwriter_put(w, tok, 3, 1), 0);
    assert_int_equal(fy_tokwriter_document(w, 1), 0);
    assert_int_equal(fy_tokwriter_document(w, 1), 0); /* nothing between: no empty document */
    assert_int_equal(fy_tokwriter_put(w, tok + 3, 2, 0), 0);
    assert_int_equal(fy_tokwriter_put(w, tok + 5, 2, 1), 0);
    assert_int_equal(fy_tokwriter_document(w, 1), 0);
    assert_int_equal(fy_tokwriter_put(w, tok + 7, 3, 1), 0);
    assert_int_equal(fy_tokwriter_document(w, 0), -EINVAL); /* a text file among records */
    assert_int_equal(fy_tokwriter_document(w, 1), 0);       /* and a last one never begun */
    assert_int_equal(fy_tokwriter_finish(&w, NULL, NULL), 0);

    size_t len;
    uint8_t *b = slurp_file(p, &len);
    const size_t mask_off = 2 * FY_TOKFILE_HEADER_BYTES, docs_off = 3 * FY_TOKFILE_HEADER_BYTES;
    assert_int_equal(len, 4 * FY_TOKFILE_HEADER_BYTES);
    assert_int_equal(le32(b + 4), 3);
    assert_int_equal(le32(b + 24), FY_TOKFILE_FLAG_LOSS_MASK | FY_TOKFILE_FLAG_RECORDS);
    assert_int_equal(le32(b + 44), 2); /* masked */
    assert_int_equal(le32(b + 52), 3); /* documents */
    assert_int_equal(le32(b + 56), 0);
    assert_int_equal(le32(b + 60), fy_tokfile_header_checksum_v3(b));
    assert_int_equal(b[mask_off], 0xe7); /* tokens 3 and 4 masked */
    const uint64_t starts[3] = {0, 3, 7};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(le32(b + docs_off + 8 * i), starts[i]);
        assert_int_equal(le32(b + docs_off + 8 * i + 4), 0);
    }
    for (size_t i = docs_off + 24; i < len; i++)
        assert_int_equal(b[i], 0);
    free(b);

    struct fy_tokfile *t;
    assert_int_equal(fy_tokfile_open(&t, p, V), 0);
    assert_int_equal(fy_tokfile_version(t), 3);
    assert_int_equal(fy_tokfile_documents(t), 3);
    assert_int_equal(fy_tokfile_documents_are_records(t), 1);
    assert_int_equal(fy_tokfile_masked(t), 2);
    assert_int_equal(fy_tokfile_source(t).eos, 2);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fy_tokfile_document_start(t, (uint64_t)i), starts[i]);
        assert_int_equal(fy_tokfile_document_end(t, (uint64_t)i), i < 2 ? starts[i + 1] : 10);
    }
    /* the split by documents: round(3 x 0.4) = 1 held out, from its first token */
    assert_int_equal(fy_tokfile_split_documents(t, 0.4), 0);
    assert_int_equal(fy_tokfile_eval_first_document(t), 2);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_TRAIN), 7);
    assert_int_equal(fy_tokfile_split_tokens(t, FY_TOKFILE_EVAL), 3);
    assert_int_equal(fy_tokfile_split_documents(t, 0.1), -EINVAL); /* none held out */
    assert_int_equal(fy_tokfile_split_documents(t, 0.9), -EINVAL); /* none trained */
    fy_tokfile_destroy(&t);

    /* tokens before the first call are a document; without a mask or identity still version 3 */
    assert_int_equal(fy_tokwriter_begin(&w, tpath("text.tok"), V, NULL, 0), 0);
    assert_int_equal(fy_tokwriter_put(w, tok, 2, 1), 0);
    assert_int_equal(fy_tokwriter_document(w, 0), 0);
    assert_int_equal(fy_tokwriter_put(w, tok, 4, 1), 0);
    assert_int_equal(fy_tokwriter_finish(&w, NULL, NULL), 0);
    assert_int_equal(fy_tokfile_open(&t, tpath("text.tok"), V), 0);
    assert_int_equal(fy_tokfile_version(t), 3);
    assert_int_equal(fy_tokfile_documents(t), 2);
    assert_int_equal(fy_tokfile_documents_are_records(t), 0);
    assert_int_equal(fy_tokfile_document_start(t, 1), 2);
    fy_tokfile_destroy(&t);

    /* more starts than the writer keeps in memory (128 Ki): through its side file */
    const uint64_t many = 300000;
    assert_int_equal(fy_tokwriter_begin(&w, tpath("many.tok"), V, NULL, 0), 0);
    for (uint64_t d = 0; d < many; d++) {
        assert_int_equal(fy_tokwriter_document(w, 1), 0);
        uint32_t one[2] = {(uint32_t)(d % V), 1};
        assert_int_equal(fy_tokwriter_put(w, one, 1 + d % 2, 1), 0);
    }
    assert_int_equal(fy_tokwriter_finish(&w, NULL, NULL), 0);
    assert_int_equal(fy_tokfile_open(&t, tpath("many.tok"), V), 0);
    assert_int_equal(fy_tokfile_documents(t), many);
    int bad = 0;
    for (uint64_t d = 0, at = 0; d < many; at += 1 + d % 2, d++)
        bad += fy_tokfile_document_start(t, d) != at || fy_tokfile_token(t, at) != d % V;
    assert_int_equal(bad, 0);
    fy_tokfile_destroy(&t);

    /* corruptions */
    patch_v3(p, tpath("first.tok"), -1, 0, docs_off, 1, 0);
    expect_open_refused(tpath("first.tok"), V, -EBADMSG, "document 0 starts at token 1");
    patch_v3(p, tpath("order.tok"), -1, 0, docs_off + 16, 3, 0);
    expect_open_refused(tpath("order.tok"), V, -EBADMSG,
                        "document 2 starts at token 3 (after 3, of 10 tokens): the document "
                        "index is corrupt");
    patch_v3(p, tpath("past.tok"), -1, 0, docs_off + 16, 10, 0);
    expect_open_refused(tpath("past.tok"), V, -EBADMSG, "document 2 starts at token 10");
    patch_v3(p, tpath("none.tok"), FY_TOKFILE_SLOT_DOCS_LO, 0, 0, 0, 0);
    expect_open_refused(tpath("none.tok"), V, -EBADMSG, "the header counts 0 documents of 10");
    patch_v3(p, tpath("toomany.tok"), FY_TOKFILE_SLOT_DOCS_LO, 11, 0, 0, 0);
    expect_open_refused(tpath("toomany.tok"), V, -EBADMSG, "the header counts 11 documents");
    patch_v3(p, tpath("cut.tok"), -1, 0, 0, 0, docs_off + 20);
    expect_open_refused(tpath("cut.tok"), V, -EBADMSG,
                        "truncated: expected 12312 bytes, found 12308");
    patch_v3(p, tpath("flags.tok"), FY_TOKFILE_SLOT_FLAGS, 5, 0, 0, 0);
    expect_open_refused(tpath("flags.tok"), V, -ENOTSUP, "unknown flags 0x5");
    b = slurp_file(p, &len);
    put32(b + 60, le32(b + 60) ^ 1);
    write_bytes(tpath("sum3.tok"), b, len);
    expect_open_refused(tpath("sum3.tok"), V, -EBADMSG, "bad header checksum");
    /* the records flag is version 3's: a version 2 header with it is refused */
    put32(b + 4, 2);
    put32(b + 4 * FY_TOKFILE_V2_SLOT_CHECKSUM, fy_tokfile_header_checksum_v2(b));
    write_bytes(tpath("v2flag.tok"), b, len);
    expect_open_refused(tpath("v2flag.tok"), V, -ENOTSUP, "unknown flags 0x3");
    free(b);
}

int main(void)
{
    fy_log_init("test", FY_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_roundtrip_widths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_atomic_and_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prepare_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_masked_format, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tokenizer_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_masked_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streaming_writer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stop_flag, setup, teardown),
        cmocka_unit_test_setup_teardown(test_document_index, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
