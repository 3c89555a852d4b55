/* Tests of the commit records (common/ckpt.c) and the state digest (common/digest.c):
 *   - the digest is XXH3-64 (its published values for "" and "a"), one flipped bit changes it, and
 *     the digest with a hole read as zero equals that of the buffer with the hole zeroed;
 *   - a record round-trips the step, seed, sequence number, copy, copies and every unit's digest;
 *   - slot 37 holds the optimizer state format: each round-trips, 0 (records written before the
 *     slot was) reads fp32, a value this build does not know is refused;
 *   - slot 38 holds the store's piece of optimizer state in KiB: it round-trips, 0 (records
 *     written before pieces) reads as whole units, a size no store can have is refused;
 *   - fy_storemeta_check: intact 0, all zeros 1 (never written), a flipped byte anywhere in the
 *     record (header, digests, padding) or a short buffer -EBADMSG; decode refuses the same;
 *   - a version 1 metadata block (stores before commit records), built slot by slot as the old
 *     format had it, is not a commit record: check and decode refuse it (a store holding one is
 *     refused by launcher/step/commit, tests/integration/test_chaos_store);
 *   - the scratch extents' size classes: the smallest that holds the bytes asked, at most 1/8
 *     larger (above 1 MiB), 128 KiB-aligned, growing, with ids inside each kind's range. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/testutil.h"
#include "common/arch/arch.h"
#include "common/ckpt.h"
#include "common/digest.h"
#include "common/model.h"

static struct fy_model_config gpt(void)
{
    /* the family named, as a decoded header names it */
    return (struct fy_model_config){.n_layer = 3, .n_head = 2, .n_embd = 16, .vocab = 50,
                                    .ctx = 32, .arch = &fy_arch_gpt2};
}

static void test_digest(void **state)
{
    (void)state;
    assert_true(fy_digest("", 0) == 0x2D06800538D394C2ull);
    assert_true(fy_digest("a", 1) == 0xE6C632B61E964E1Full);
    uint8_t buf[4096];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 7);
    uint64_t d = fy_digest(buf, sizeof buf);
    buf[2049] ^= 1;
    assert_true(fy_digest(buf, sizeof buf) != d);
    /* with a hole read as zero: the digest of the buffer with those bytes zeroed */
    uint64_t holed = fy_digest_zeroing(buf, sizeof buf, 136, 8);
    memset(buf + 136, 0, 8);
    assert_true(holed == fy_digest(buf, sizeof buf));
}

static uint8_t rec[FY_COMMIT_RECORD_BYTES];
static struct fy_storemeta m, back;

static void test_record_round_trip(void **state)
{
    (void)state;
    m = (struct fy_storemeta){.model = gpt(), .step = 1234567890123ull, .seed = 77, .seq = 9,
                              .copy = 1, .copies = 2};
    for (unsigned u = 0; u < fy_model_unit_count(&m.model); u++)
        m.digest[u] = 0x0123456789abcdefull * (u + 1);
    fy_storemeta_encode(&m, rec);
    assert_int_equal(fy_storemeta_check(rec, sizeof rec), 0);
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), 0);
    assert_true(back.step == m.step && back.seed == m.seed && back.seq == m.seq);
    assert_int_equal(back.copy, 1);
    assert_true(fy_test_same_model(&back.model, &m.model));
    assert_memory_equal(back.digest, m.digest, fy_model_unit_count(&m.model) * sizeof m.digest[0]);
    assert_int_equal(back.copies, 2);
    /* one copy (init --state-copies 1); copy 1 of one is refused; 0 (the first records) reads 2 */
    m.copy = 0;
    m.copies = 1;
    fy_storemeta_encode(&m, rec);
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), 0);
    assert_int_equal(back.copies, 1);
    m.copy = 1;
    fy_storemeta_encode(&m, rec);
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), -EBADMSG);
    m.copies = 0;
    fy_storemeta_encode(&m, rec);
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), 0);
    assert_int_equal(back.copies, 2);
}

static uint32_t slot32(const uint8_t *b, int slot)
{
    return b[4 * slot] | (uint32_t)b[4 * slot + 1] << 8 | (uint32_t)b[4 * slot + 2] << 16 |
           (uint32_t)b[4 * slot + 3] << 24;
}

/* Slot 37: the optimizer state format, outside the config hash. */
static void test_record_optim_state(void **state)
{
    (void)state;
    for (int format = 0; format < FY_OPTIM_STATE_COUNT; format++) {
        m = (struct fy_storemeta){.model = gpt(), .step = 12, .seed = 3, .seq = 4, .copies = 2};
        m.model.optim_state = format;
        fy_storemeta_encode(&m, rec);
        assert_int_equal(slot32(rec, 37), (uint32_t)format);
        assert_int_equal(fy_storemeta_check(rec, sizeof rec), 0);
        memset(&back, 0xff, sizeof back);
        assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), 0);
        assert_int_equal(back.model.optim_state, format);
        assert_true(fy_test_same_model(&back.model, &m.model));
        assert_true(back.step == 12 && back.seq == 4);
    }
    /* fp32 writes 0 there: the bytes of a record from before the slot, which read as fp32 */
    m.model.optim_state = FY_OPTIM_STATE_FP32;
    fy_storemeta_encode(&m, rec);
    for (int i = 4 * 37; i < 4 * 38; i++)
        assert_int_equal(rec[i], 0);
    back.model.optim_state = FY_OPTIM_STATE_INT8;
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), 0);
    assert_int_equal(back.model.optim_state, FY_OPTIM_STATE_FP32);
    /* a format this build does not know (a newer Fuyou's), its digest intact: refused */
    m.model.optim_state = 7;
    fy_storemeta_encode(&m, rec);
    assert_int_equal(slot32(rec, 37), 7);
    assert_int_equal(fy_storemeta_check(rec, sizeof rec), 0);
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), -EBADMSG);
    m.model.optim_state = FY_OPTIM_STATE_COUNT;
    fy_storemeta_encode(&m, rec);
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), -EBADMSG);
}

/* Slot 38: the piece of optimizer state, in KiB, outside the config hash. */
static void test_record_state_piece(void **state)
{
    (void)state;
    m = (struct fy_storemeta){.model = gpt(), .step = 5, .seed = 3, .seq = 4, .copies = 2};
    m.model.state_piece = 1ull << 30;
    fy_storemeta_encode(&m, rec);
    assert_int_equal(slot32(rec, 38), 1u << 20);
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), 0);
    assert_int_equal(back.model.state_piece, 1ull << 30);
    const struct fy_model_config plain = gpt();
    assert_true(fy_model_config_hash(&back.model) == fy_model_config_hash(&plain));
    /* 0 there (every record from before pieces): whole units */
    m.model.state_piece = 0;
    fy_storemeta_encode(&m, rec);
    for (int i = 4 * 38; i < 4 * 39; i++)
        assert_int_equal(rec[i], 0);
    back.model.state_piece = 99;
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), 0);
    assert_int_equal(back.model.state_piece, 0);
    /* 1 KiB, under any piece a store is made with, its digest intact: refused */
    m.model.state_piece = 1024;
    fy_storemeta_encode(&m, rec);
    assert_int_equal(fy_storemeta_check(rec, sizeof rec), 0);
    assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), -EBADMSG);
}

static void test_record_damage_found(void **state)
{
    (void)state;
    m = (struct fy_storemeta){.model = gpt(), .step = 5, .seq = 2};
    m.digest[0] = 42;
    fy_storemeta_encode(&m, rec);
    /* the header, a unit's digest, the padding after the digests */
    const size_t spots[] = {4 * 9, 4 * 31, FY_CKPT_BLOCK, FY_COMMIT_RECORD_BYTES - 1};
    for (size_t i = 0; i < sizeof spots / sizeof spots[0]; i++) {
        rec[spots[i]] ^= 0x10;
        assert_int_equal(fy_storemeta_check(rec, sizeof rec), -EBADMSG);
        assert_int_equal(fy_storemeta_decode(rec, sizeof rec, "test", &back), -EBADMSG);
        rec[spots[i]] ^= 0x10;
    }
    assert_int_equal(fy_storemeta_check(rec, sizeof rec), 0);
    assert_int_equal(fy_storemeta_check(rec, FY_CKPT_BLOCK), -EBADMSG); /* cut short */
    assert_int_equal(fy_storemeta_decode(rec, FY_CKPT_BLOCK, "test", &back), -EBADMSG);
    memset(rec, 0, sizeof rec);
    assert_int_equal(fy_storemeta_check(rec, sizeof rec), 1);
}

static void put32(uint8_t *b, int slot, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[4 * slot + i] = (uint8_t)(v >> (8 * i));
}

/* The version 1 block as stores before commit records wrote it: slots 0..12, the FNV-1a checksum
 * of their bytes in slot 13, slot 29 the unsynced flag. */
static void test_version1_block_refused(void **state)
{
    (void)state;
    struct fy_model_config c = gpt();
    uint8_t block[FY_CKPT_BLOCK] = {0};
    uint64_t hash = fy_model_config_hash(&c);
    const uint32_t v[13] = {FY_STOREMETA_MAGIC, 1, c.n_layer, c.n_head, c.n_embd, c.vocab, c.ctx,
                            (uint32_t)hash, (uint32_t)(hash >> 32), 40, 0, 9, 0};
    for (int i = 0; i < 13; i++)
        put32(block, i, v[i]);
    uint32_t h = 2166136261u;
    for (int i = 0; i < 4 * 13; i++)
        h = (h ^ block[i]) * 16777619u;
    put32(block, 13, h);
    put32(block, 29, 1);
    assert_int_equal(fy_storemeta_check(block, sizeof block), -EBADMSG);
    assert_int_equal(fy_storemeta_decode(block, sizeof block, "test", &back), -EBADMSG);
    /* the same slots with version 2 are a commit record's header: the version is what refuses */
    put32(block, 1, FY_COMMIT_VERSION);
    h = 2166136261u;
    for (int i = 0; i < 4 * 13; i++)
        h = (h ^ block[i]) * 16777619u;
    put32(block, 13, h);
    static uint8_t whole[FY_COMMIT_RECORD_BYTES];
    memcpy(whole, block, sizeof block);
    assert_int_equal(fy_storemeta_check(whole, sizeof whole), -EBADMSG); /* no digest yet */
    m = (struct fy_storemeta){.model = c, .step = 40, .seed = 9, .seq = 1, .copies = 2};
    fy_storemeta_encode(&m, whole);
    assert_int_equal(fy_storemeta_check(whole, sizeof whole), 0);
    assert_int_equal(memcmp(whole, block, 4 * 14), 0);
}

static void test_scratch_classes(void **state)
{
    (void)state;
    assert_int_equal(fy_scratch_class_bytes(0), 1u << 20);
    assert_int_equal(fy_scratch_class_bytes(1), (1u << 20) + (1u << 17));
    assert_int_equal(fy_scratch_class_bytes(8), 2u << 20);
    assert_int_equal(fy_scratch_class(1), 0);
    assert_int_equal(fy_scratch_class(1u << 20), 0);
    assert_int_equal(fy_scratch_class((1u << 20) + 1), 1);
    /* 1.3B's internals at B 30 (36.6 GiB): 40 GiB, where powers of two took 64 */
    assert_int_equal(fy_scratch_bytes(39299612672ull), 40ull << 30);
    for (unsigned k = 1; k < 8 * 43 - 1; k++) {
        uint64_t b = fy_scratch_class_bytes(k), below = fy_scratch_class_bytes(k - 1);
        assert_true(b > below && b % (128u << 10) == 0);
        assert_true((double)b <= 1.125 * (double)below);
        assert_int_equal(fy_scratch_class(b), k);
        assert_int_equal(fy_scratch_class(below + 1), k);
        assert_true(FY_TENSOR_CKPT_SPILL(k) < FY_TENSOR_SAVED_SPILL(0) &&
                    FY_TENSOR_SAVED_SPILL(k) < FY_TENSOR_PROBE(0));
    }
    uint64_t seed = 7;
    for (int i = 0; i < 100000; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t bytes = (seed >> 20) + 1; /* up to 16 TiB */
        uint64_t got = fy_scratch_bytes(bytes);
        assert_true(got >= bytes);
        assert_true(bytes <= (1u << 20) ? got == (1u << 20) : (double)got < 1.125 * (double)bytes);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest),
        cmocka_unit_test(test_record_round_trip),
        cmocka_unit_test(test_record_optim_state),
        cmocka_unit_test(test_record_state_piece),
        cmocka_unit_test(test_record_damage_found),
        cmocka_unit_test(test_version1_block_refused),
        cmocka_unit_test(test_scratch_classes),
    };
    return cmocka_run_group_tests_name("ckpt", tests, NULL, NULL);
}
