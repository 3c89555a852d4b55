/* The whole GPT model for the tests that hold a backend against an outside reference
 * (tests/reference/gpt_ref.py, gpt_torch.py): parameters, tokens and targets, the whole model's
 * forward and backward through the backend interface, the references' file formats, and running a
 * reference script with a time limit. */
#include "refmodel.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/model/arch/arch.h"
#include "common/model/arch/gpt2.h"
#include "common/model/arch/llama.h"
#include "gpu_worker/backend.h"
#include "tests/testutil.h"

#define REF_MAGIC 0x52475946 /* "FYGR" as little-endian bytes */
#define REF_VERSION 1

static int set_err(struct fy_refmodel *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int set_err(struct fy_refmodel *m, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->err, sizeof m->err, fmt, ap);
    va_end(ap);
    return -1;
}

/* Zeroed floats (at least one, so that a NULL means out of memory). */
static float *falloc(size_t n) { return calloc(n ? n : 1, sizeof(float)); }

/* Llama: the noise on a unit's RMSNorm weights (1 at init): the blocks' two, the final one. */
static void perturb_llama_unit(const struct fy_refmodel *m, unsigned u, uint64_t *rng)
{
    const size_t C = m->cfg.n_embd;
    struct fy_llama_unit_layout l;
    fy_llama_unit_layout(&m->cfg, &l);
    float *p = m->params[u];
    enum fy_unit_kind kind = fy_model_unit_kind(&m->cfg, u);
    for (size_t i = 0; kind != FY_UNIT_EMBED && i < C; i++) {
        if (kind == FY_UNIT_FINAL) {
            p[i] += fy_test_uniform(rng, -0.2f, 0.2f);
            continue;
        }
        p[l.input_norm + i] += fy_test_uniform(rng, -0.2f, 0.2f);
        p[l.post_norm + i] += fy_test_uniform(rng, -0.2f, 0.2f);
    }
}

/* GPT-2: the noise on the biases and LayerNorm parameters of a unit. */
static void perturb_gpt2_unit(const struct fy_refmodel *m, unsigned u, uint64_t *rng)
{
    const size_t C = m->cfg.n_embd;
    struct fy_gpt2_block_layout l;
    fy_gpt2_block_layout(&m->cfg, &l);
    float *p = m->params[u];
    switch (fy_model_unit_kind(&m->cfg, u)) {
    case FY_UNIT_EMBED: break;
    case FY_UNIT_FINAL:
        for (size_t i = 0; i < C; i++) {
            p[i] += fy_test_uniform(rng, -0.2f, 0.2f);
            p[C + i] += fy_test_uniform(rng, -0.1f, 0.1f);
        }
        break;
    case FY_UNIT_BLOCK: {
        const struct {
            size_t at, n;
            float amp;
        } noise[] = {{l.ln1_w, C, 0.2f},     {l.ln1_b, C, 0.1f}, {l.qkv_b, 3 * C, 0.05f},
                     {l.attn_b, C, 0.05f},   {l.ln2_w, C, 0.2f}, {l.ln2_b, C, 0.1f},
                     {l.fc_b, 4 * C, 0.05f}, {l.proj_b, C, 0.05f}};
        for (size_t k = 0; k < sizeof noise / sizeof noise[0]; k++)
            for (size_t i = 0; i < noise[k].n; i++)
                p[noise[k].at + i] += fy_test_uniform(rng, -noise[k].amp, noise[k].amp);
        break;
    }
    }
}

/* Any other family: the noise on every tensor its table initialises to 1 (+-0.2) or 0 (+-0.1), one
 * tensor after another. */
static void perturb_by_table(const struct fy_refmodel *m, unsigned u, uint64_t *rng)
{
    struct fy_tensor_spec t[FY_UNIT_MAX_TENSORS];
    unsigned n = fy_unit_tensors(&m->cfg, u, t);
    for (unsigned k = 0; k < n; k++) {
        float amp = t[k].init == FY_INIT_ONE ? 0.2f : t[k].init == FY_INIT_ZERO ? 0.1f : 0.0f;
        for (uint64_t i = 0; amp > 0.0f && i < fy_tensor_numel(&t[k]); i++)
            m->params[u][t[k].offset + i] += fy_test_uniform(rng, -amp, amp);
    }
}

typedef void perturb_fn(const struct fy_refmodel *m, unsigned u, uint64_t *rng);

/* The noise a family's parameters get (see fy_refmodel_init), by the registry's name: GPT-2's and
 * Llama's as they always were, so that the tests' inputs stay the same bits; the tensor table's
 * for any other family. */
static perturb_fn *perturbation_of(const struct fy_model_config *c)
{
    static const struct {
        const char *family;
        perturb_fn *perturb;
    } perturbations[] = {
        {"gpt2", perturb_gpt2_unit},
        {"llama", perturb_llama_unit},
    };
    for (size_t i = 0; i < sizeof perturbations / sizeof perturbations[0]; i++)
        if (strcmp(perturbations[i].family, fy_model_arch(c)->name) == 0)
            return perturbations[i].perturb;
    return perturb_by_table;
}

int fy_refmodel_init(struct fy_refmodel *m, const struct fy_model_config *cfg, int B, int T,
                     uint64_t seed)
{
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->B = B;
    m->T = T;
    m->n_units = fy_model_unit_count(cfg);
    if (m->n_units > FY_REFMODEL_MAX_UNITS || B < 2 || T < 4) {
        set_err(m, "reference model: %u units (at most %d), batch %d x %d (at least 2 x 4)",
             m->n_units, FY_REFMODEL_MAX_UNITS, B, T);
        m->n_units = 0;
        return -1;
    }
    perturb_fn *perturb = perturbation_of(cfg);
    const size_t n_tok = (size_t)B * T;
    m->tokens = calloc(n_tok, sizeof *m->tokens);
    m->targets = calloc(n_tok, sizeof *m->targets);
    int ok = m->tokens != NULL && m->targets != NULL;
    uint64_t rng = seed;
    for (unsigned u = 0; u < m->n_units && ok; u++) {
        m->sizes[u] = fy_model_unit_params(cfg, u);
        m->params[u] = falloc(m->sizes[u]);
        m->grads[u] = falloc(m->sizes[u]);
        ok = m->params[u] != NULL && m->grads[u] != NULL;
        if (ok) {
            fy_model_init_unit(cfg, u, seed, m->params[u]);
            perturb(m, u, &rng);
        }
    }
    if (!ok) {
        fy_refmodel_free(m);
        return set_err(m, "reference model: out of memory");
    }
    for (size_t i = 0; i < n_tok; i++) {
        m->tokens[i] = (int32_t)(fy_test_rand(&rng) % cfg->vocab);
        m->targets[i] = (int32_t)(fy_test_rand(&rng) % cfg->vocab);
    }
    m->targets[T + 3] = -1; /* ignored: out of the mean, no gradient */
    return 0;
}

int fy_refmodel_pack(struct fy_refmodel *m, int max_len, uint64_t seed)
{
    size_t n = (size_t)m->B * m->T;
    free(m->positions);
    m->positions = calloc(n, sizeof *m->positions);
    if (m->positions == NULL || max_len < 1)
        return set_err(m, "reference model: out of memory for positions (or max_len %d)", max_len);
    uint64_t rng = seed;
    for (int b = 0; b < m->B; b++)
        for (int t = 0, p = 0, len = 0; t < m->T; t++, p++) {
            size_t k = (size_t)b * m->T + t;
            if (p == len) {
                p = 0;
                len = 1 + (int)(fy_test_rand(&rng) % (uint64_t)max_len);
            }
            m->positions[k] = p;
            if (len == 1 || t == m->T - 1)
                m->targets[k] = -1;
        }
    return 0;
}

struct fy_model_config fy_refmodel_llama_small(int tied)
{
    struct fy_model_config c = {
        .n_layer = 2,
        .n_head = 4,
        .n_embd = 256,
        .vocab = 300,
        .ctx = 64,
        .arch = &fy_arch_llama,
        .family = fy_llama_family((struct fy_llama_fields){.n_kv_head = 2,
                                                           .n_inter = 344,
                                                           .tied = (uint32_t)tied,
                                                           .rope_type = FY_ROPE_LLAMA3,
                                                           .rope_orig_max_pos = 8,
                                                           .rms_eps = 1e-5f,
                                                           .rope_theta = 500000.0,
                                                           .rope_factor = 8.0,
                                                           .rope_low_freq_factor = 1.0,
                                                           .rope_high_freq_factor = 4.0})};
    return c;
}

void fy_refmodel_free(struct fy_refmodel *m)
{
    for (unsigned u = 0; u < m->n_units; u++) {
        free(m->params[u]);
        free(m->grads[u]);
        m->params[u] = m->grads[u] = NULL;
    }
    free(m->tokens);
    free(m->targets);
    free(m->positions);
    free(m->logits);
    m->tokens = m->targets = m->positions = NULL;
    m->logits = NULL;
}

/* The composition proper; xs, dx and dy allocated by the caller. */
static int forward_backward(struct fy_refmodel *m, struct fy_backend *b, float *xs, float *dx,
                            float *dy)
{
    const unsigned L = m->cfg.n_layer;
    const size_t act = (size_t)m->B * m->T * m->cfg.n_embd;
    int rc;
    if ((rc = fy_backend_model_prepare(b, &m->cfg, m->B, m->T)) != 0)
        return set_err(m, "model_prepare for %d x %d failed (%d)", m->B, m->T, rc), rc;
    if ((rc = fy_backend_model_embed_forward(b, m->params[0], m->tokens, m->positions, xs)) != 0)
        return set_err(m, "model_embed_forward failed (%d)", rc), rc;
    for (unsigned l = 0; l < L; l++)
        if ((rc = fy_backend_model_block_forward(b, 1 + l, m->params[1 + l], m->positions,
                                                 xs + act * l, xs + act * (l + 1), NULL)) != 0)
            return set_err(m, "model_block_forward of block %u failed (%d)", l, rc), rc;
    free(m->logits);
    m->logits = falloc((size_t)m->B * m->T * m->cfg.vocab);
    if (m->logits == NULL)
        return set_err(m, "reference model: out of memory for the logits");
    if ((rc = fy_backend_model_logits(b, m->params[L + 1], m->params[0], xs + act * L, m->logits)) != 0)
        return set_err(m, "model_logits failed (%d)", rc), rc;
    /* the head overwrites dembed with its share of the wte gradient (wpe part zero) */
    if ((rc = fy_backend_model_head(b, m->params[L + 1], m->params[0], xs + act * L, m->targets,
                                  &m->loss, dy, m->grads[L + 1], m->grads[0])) != 0)
        return set_err(m, "model_head failed (%d)", rc), rc;
    for (unsigned l = L; l-- > 0;) {
        if ((rc = fy_backend_model_block_backward(b, 1 + l, m->params[1 + l], m->positions,
                                                  xs + act * l, dy, dx, m->grads[1 + l], NULL)) !=
            0)
            return set_err(m, "model_block_backward of block %u failed (%d)", l, rc), rc;
        float *t = dx;
        dx = dy;
        dy = t; /* dy now holds the gradient of this block's input */
    }
    if ((rc = fy_backend_model_embed_backward(b, m->tokens, m->positions, dy, m->grads[0])) != 0)
        return set_err(m, "model_embed_backward failed (%d)", rc), rc;
    return 0;
}

int fy_refmodel_forward_backward(struct fy_refmodel *m, struct fy_backend *b)
{
    const size_t act = (size_t)m->B * m->T * m->cfg.n_embd;
    float *xs = falloc(act * (m->cfg.n_layer + 1)); /* xs[l]: input of block l; xs[L]: of the head */
    float *dx = falloc(act), *dy = falloc(act);
    int rc = xs && dx && dy ? forward_backward(m, b, xs, dx, dy)
                            : set_err(m, "reference model: out of memory for the activations");
    free(xs);
    free(dx);
    free(dy);
    return rc;
}

static int write_all(FILE *f, const void *p, size_t size, size_t n)
{
    return fwrite(p, size, n, f) == n ? 0 : -1;
}

int fy_refmodel_write_input(struct fy_refmodel *m, const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL)
        return set_err(m, "cannot create %s: %s", path, strerror(errno));
    const struct fy_model_config *c = &m->cfg;
    const int32_t hdr[9] = {REF_MAGIC,          REF_VERSION,        m->B,
                            m->T,               (int32_t)c->n_layer, (int32_t)c->n_head,
                            (int32_t)c->n_embd, (int32_t)c->vocab,   (int32_t)c->ctx};
    const size_t n_tok = (size_t)m->B * m->T;
    int rc = write_all(f, hdr, sizeof hdr[0], 9);
    for (unsigned u = 0; u < m->n_units; u++)
        rc |= write_all(f, m->params[u], sizeof(float), m->sizes[u]);
    rc |= write_all(f, m->tokens, sizeof(int32_t), n_tok);
    rc |= write_all(f, m->targets, sizeof(int32_t), n_tok);
    rc |= fclose(f);
    return rc == 0 ? 0 : set_err(m, "cannot write %s", path);
}

int fy_refmodel_read_output(struct fy_refmodel *m, const char *path, struct fy_refmodel_output *out)
{
    memset(out, 0, sizeof *out);
    size_t len = 0, n = 1;
    for (unsigned u = 0; u < m->n_units; u++)
        n += m->sizes[u];
    char *buf = fy_test_slurp(path, &len);
    if (buf == NULL)
        return set_err(m, "cannot read %s", path);
    if (len != n * sizeof(double)) {
        free(buf);
        return set_err(m, "%s: %zu bytes, expected %zu (loss + %zu gradients as float64)", path, len,
                    n * sizeof(double), n - 1);
    }
    const char *at = buf;
    memcpy(&out->loss, at, sizeof(double));
    at += sizeof(double);
    for (unsigned u = 0; u < m->n_units; u++) {
        out->grads[u] = malloc(m->sizes[u] * sizeof(double));
        if (out->grads[u] == NULL) {
            free(buf);
            fy_refmodel_output_free(m, out);
            return set_err(m, "%s: out of memory", path);
        }
        memcpy(out->grads[u], at, m->sizes[u] * sizeof(double));
        at += m->sizes[u] * sizeof(double);
    }
    free(buf);
    return 0;
}

void fy_refmodel_output_free(const struct fy_refmodel *m, struct fy_refmodel_output *out)
{
    for (unsigned u = 0; u < m->n_units; u++) {
        free(out->grads[u]);
        out->grads[u] = NULL;
    }
}

int fy_refmodel_little_endian(void)
{
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 1;
}

int fy_refmodel_python_has(const char *modules)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "python3 -c 'import %s' >/dev/null 2>&1", modules);
    return system(cmd) == 0;
}

int fy_refmodel_script(const char *name, char *buf, size_t len)
{
    const char *src = getenv("FUYOU_SRC");
    snprintf(buf, len, "%s/tests/reference/%s", src ? src : ".", name);
    return access(buf, R_OK) == 0 ? 0 : -1;
}

int fy_refmodel_run(char *const argv[], int seconds)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execvp(argv[0], argv);
        fprintf(stderr, "cannot run %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    int st = fy_test_wait((int)pid, seconds);
    if (st == -1) {
        fprintf(stderr, "%s %s: killed after %d s\n", argv[0], argv[1] ? argv[1] : "", seconds);
        return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int fy_refmodel_metric(const char *run, int step, const char *key, double *value)
{
    char path[1024], want[64];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    snprintf(want, sizeof want, "{\"step\": %d,", step);
    char *text = fy_test_slurp(path, NULL);
    if (text == NULL) {
        fprintf(stderr, "%s: cannot read it\n", path);
        return -1;
    }
    char *line = strstr(text, want);
    char *end = line != NULL ? strchr(line, '\n') : NULL;
    char *at = line != NULL ? strstr(line, key) : NULL;
    int found = at != NULL && (end == NULL || at < end);
    if (found)
        *value = strtod(at + strlen(key), NULL);
    else
        fprintf(stderr, "%s: no %s on the line of step %d\n", path, key, step);
    free(text);
    return found ? 0 : -1;
}

double fy_refmodel_rel_err(const float *a, const float *ref, size_t n, const char *what)
{
    double num = 0, den = 0, largest = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        num += d * d;
        den += (double)ref[i] * ref[i];
        if (!(d <= largest)) /* a NaN counts as infinitely far */
            largest = d == d ? d : INFINITY;
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("%-24s n=%-9zu largest difference %.3e, relative Frobenius %.3e\n", what, n, largest,
           rel);
    return rel != rel ? INFINITY : rel;
}
