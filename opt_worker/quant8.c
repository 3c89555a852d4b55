/* Block-wise 8-bit quantization with the dynamic maps (see quant8.h for the exact format). */
#include "opt_worker/quant8.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>

struct quant8_table {
    float map[FY_QUANT8_CODES];
    double mid[FY_QUANT8_CODES - 1]; /* exact midpoints of neighbours: mid[k] between map[k], map[k+1] */
    float mid_below[FY_QUANT8_CODES - 1]; /* mid[k] rounded down to float (see quant8.h) */
    uint8_t zero_code;
};

static struct quant8_table tables[2]; /* [0] unsigned, [1] signed */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static void build_table(struct quant8_table *t, int is_signed)
{
    static const double decade[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    int n = 0;
    for (int e = 0; e < 7; e++) {
        int fracs = is_signed ? 1 << e : 1 << (e + 1);
        for (int j = 0; j < fracs; j++) {
            double frac = 0.1 + 0.9 * (double)(2 * j + 1) / (double)(2 * fracs);
            float v = (float)(frac * decade[e]);
            t->map[n++] = v;
            if (is_signed)
                t->map[n++] = -v;
        }
    }
    t->map[n++] = 0.0f;
    t->map[n++] = 1.0f;
    qsort(t->map, FY_QUANT8_CODES, sizeof t->map[0], cmp_float);
    /* The sum of two neighbouring floats is exact in double (their exponents differ by far less
     * than 53 - 24), so are the midpoints. */
    for (int k = 0; k < FY_QUANT8_CODES - 1; k++)
        t->mid[k] = ((double)t->map[k] + (double)t->map[k + 1]) / 2.0;
    for (int k = 0; k < FY_QUANT8_CODES - 1; k++) {
        float f = (float)t->mid[k];
        t->mid_below[k] = (double)f > t->mid[k] ? nextafterf(f, -INFINITY) : f;
    }
}

static uint8_t nearest_code(const double *mid, float y);

static void build_tables(void)
{
    build_table(&tables[0], 0);
    build_table(&tables[1], 1);
    for (int s = 0; s < 2; s++)
        tables[s].zero_code = nearest_code(tables[s].mid, 0.0f);
}

static const struct quant8_table *table(int is_signed)
{
    pthread_once(&tables_once, build_tables);
    return &tables[is_signed ? 1 : 0];
}

const float *fy_quant8_map(int is_signed)
{
    return table(is_signed)->map;
}

size_t fy_quant8_blocks(size_t n)
{
    return n / FY_QUANT8_BLOCK + (n % FY_QUANT8_BLOCK != 0);
}

/* The number of midpoints < y: the nearest code, ties (y on a midpoint) to the lower index. */
static uint8_t nearest_code(const double *mid, float y)
{
    double yd = y;
    int lo = 0, hi = FY_QUANT8_CODES - 1; /* answer in [lo, hi] */
    while (lo < hi) {
        int m = (lo + hi) / 2;
        if (mid[m] < yd)
            lo = m + 1;
        else
            hi = m;
    }
    return (uint8_t)lo;
}

void fy_quant8_quantize_block(const float *xb, size_t len, int is_signed, uint8_t *codes,
                              float *absmax)
{
    const struct quant8_table *t = table(is_signed);
    float amax = 0.0f;
    for (size_t i = 0; i < len; i++) {
        float a = fabsf(xb[i]);
        if (a > amax)
            amax = a;
    }
    *absmax = amax;
    for (size_t i = 0; i < len; i++)
        codes[i] = amax == 0.0f ? t->zero_code : nearest_code(t->mid, xb[i] / amax);
}

int fy_quant8_quantize(const float *x, size_t n, int is_signed, uint8_t *codes, float *absmax)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || (!is_signed && x[i] < 0.0f))
            return -EINVAL;
    for (size_t b = 0, start = 0; start < n; b++, start += FY_QUANT8_BLOCK) {
        size_t len = n - start < FY_QUANT8_BLOCK ? n - start : FY_QUANT8_BLOCK;
        fy_quant8_quantize_block(x + start, len, is_signed, codes + start, &absmax[b]);
    }
    return 0;
}

uint8_t fy_quant8_zero_code(int is_signed)
{
    return table(is_signed)->zero_code;
}

const float *fy_quant8_midpoints_below(int is_signed)
{
    return table(is_signed)->mid_below;
}

void fy_quant8_dequantize(const uint8_t *codes, const float *absmax, size_t n, int is_signed,
                          float *out)
{
    const float *map = table(is_signed)->map;
    for (size_t i = 0; i < n; i++)
        out[i] = map[codes[i]] * absmax[i / FY_QUANT8_BLOCK];
}
