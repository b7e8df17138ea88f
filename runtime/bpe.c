/* bpe.c — GPT-2's byte-level BPE: loading encoder.json and vocab.bpe,
 * encoding and decoding. See bpe.h for the algorithm. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "bpe.h"
#include "file.h" /* mesh__read_file */

#include <pcre2.h>  /* defines: pcre2_compile, pcre2_match, ... */
#include <stdarg.h> /* va_list */
#include <stdint.h> /* uint64_t, uint32_t */
#include <stdio.h>  /* vsnprintf */
#include <stdlib.h> /* malloc, free */
#include <string.h> /* memcpy */

enum { BPE_MAX_ID = 1 << 24, BPE_ALPHABET = 256 + 68 };

static const char bpe_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

typedef struct bpe_merge {
    uint64_t pair; /* left id << 32 | right id; 0 marks an empty slot (pair + 1 stored) */
    int32_t rank, result;
} bpe_merge;

struct mesh__bpe {
    int vocab;                /* largest id + 1 */
    int cap;                  /* ids text/len have room for */
    char **text;              /* text[id]: the token's bytes, NULL for a gap */
    uint32_t *len;            /* len[id] */
    int32_t *by_text;         /* open-addressing table of ids hashed by bytes */
    size_t by_text_mask;
    bpe_merge *merges;        /* open-addressing table of merges */
    size_t merges_mask;
    int32_t byte_id[256];     /* id of each one-byte token */
    pcre2_code *re;           /* the pre-tokenizer */
};

/* ---- errors ---- */

typedef struct bpe_src {
    const char *s, *name;
    size_t n, i;
    char *err;
    size_t errn;
} bpe_src;

static void set_err(char *err, size_t n, const char *fmt, ...)
{
    if (!err || n == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
}

/* "NAME:LINE:COL: error: WHY" for the byte offset at. */
static void src_err(bpe_src *src, size_t at, const char *why)
{
    size_t line = 1, col = 1;
    for (size_t k = 0; k < at && k < src->n; k++) {
        if (src->s[k] == '\n') line++, col = 1;
        else if (((unsigned char)src->s[k] & 0xC0) != 0x80) col++;
    }
    set_err(src->err, src->errn, "%s:%zu:%zu: error: %s", src->name, line, col, why);
}

/* ---- hashing ---- */

static uint64_t hash_bytes(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t k = 0; k < n; k++) h = (h ^ (unsigned char)p[k]) * 1099511628211ull;
    return h;
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static size_t table_size(size_t n)
{
    size_t size = 64;
    while (size < 2 * n) size *= 2;
    return size;
}

/* Slot of the bytes in by_text: holding their id, or empty (-1). */
static size_t text_slot(const mesh__bpe *b, const char *p, size_t n)
{
    size_t k = (size_t)hash_bytes(p, n) & b->by_text_mask;
    for (;;) {
        int32_t id = b->by_text[k];
        if (id < 0 || (b->len[id] == n && memcmp(b->text[id], p, n) == 0)) return k;
        k = (k + 1) & b->by_text_mask;
    }
}

int mesh__bpe_id(const mesh__bpe *bpe, const char *bytes, size_t len)
{
    return bpe->by_text[text_slot(bpe, bytes, len)];
}

static const bpe_merge *merge_find(const mesh__bpe *b, int32_t left, int32_t right)
{
    uint64_t key = ((uint64_t)left << 32 | (uint32_t)right) + 1;
    size_t k = (size_t)hash_u64(key) & b->merges_mask;
    while (b->merges[k].pair && b->merges[k].pair != key) k = (k + 1) & b->merges_mask;
    return b->merges[k].pair ? &b->merges[k] : NULL;
}

/* ---- the byte-level alphabet ---- */

/* GPT-2 writes byte b as code point cp[b]: the printable bytes '!'..'~',
 * 0xA1..0xAC and 0xAE..0xFF as themselves, the other 68 as 256, 257, ...
 * in byte order. byte_of[cp] inverts it (-1: not in the alphabet). */
static void alphabet(int byte_of[BPE_ALPHABET])
{
    for (int c = 0; c < BPE_ALPHABET; c++) byte_of[c] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        byte_of[printable ? b : next++] = b;
    }
}

/* Decodes one UTF-8 code point at p[0..n); returns its length, or 0 if it
 * is not valid (overlong, surrogate, beyond U+10FFFF, truncated). */
static size_t utf8_next(const unsigned char *p, size_t n, uint32_t *cp)
{
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    size_t len = p[0] < 0x80 ? 1 : (p[0] >> 5) == 6 ? 2 : (p[0] >> 4) == 14 ? 3
               : (p[0] >> 3) == 30 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    uint32_t c = len == 1 ? p[0] : p[0] & (0x7Fu >> len);
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) return 0;
        c = c << 6 | (p[k] & 0x3F);
    }
    if (c < min[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

/* Turns UTF-8 text in the byte-level alphabet into raw bytes, in place
 * (the result is never longer). Returns the length, or -1. */
static long to_bytes(char *s, size_t n, const int byte_of[BPE_ALPHABET])
{
    size_t out = 0;
    for (size_t k = 0; k < n;) {
        uint32_t cp;
        size_t len = utf8_next((const unsigned char *)s + k, n - k, &cp);
        if (len == 0 || cp >= BPE_ALPHABET || byte_of[cp] < 0) return -1;
        s[out++] = (char)byte_of[cp];
        k += len;
    }
    return (long)out;
}

/* ---- encoder.json ---- */

static void skip_ws(bpe_src *src)
{
    while (src->i < src->n && strchr(" \t\r\n", src->s[src->i]) && src->s[src->i]) src->i++;
}

static int hex4(const char *p, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

static size_t put_utf8(char *out, uint32_t c)
{
    if (c < 0x80) { out[0] = (char)c; return 1; }
    if (c < 0x800) { out[0] = (char)(0xC0 | c >> 6); out[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | c >> 12);
        out[1] = (char)(0x80 | (c >> 6 & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | c >> 18);
    out[1] = (char)(0x80 | (c >> 12 & 0x3F));
    out[2] = (char)(0x80 | (c >> 6 & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Reads a JSON string at src->i into out (its unescaped UTF-8, at most as
 * long as the source). Returns the length, or -1 after reporting. */
static long json_string(bpe_src *src, char *out)
{
    size_t start = src->i, len = 0;
    if (src->i >= src->n || src->s[src->i] != '"') {
        src_err(src, src->i, "expected a string");
        return -1;
    }
    src->i++;
    for (;;) {
        if (src->i >= src->n) { src_err(src, start, "unterminated string"); return -1; }
        unsigned char c = (unsigned char)src->s[src->i];
        if (c == '"') { src->i++; return (long)len; }
        if (c < 0x20) { src_err(src, src->i, "control character in a string"); return -1; }
        if (c != '\\') { out[len++] = (char)c; src->i++; continue; }
        if (src->i + 1 >= src->n) { src_err(src, start, "unterminated string"); return -1; }
        char e = src->s[src->i + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            out[len++] = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            src->i += 2;
            continue;
        }
        uint32_t cp, lo;
        if (e != 'u' || src->i + 6 > src->n || hex4(src->s + src->i + 2, &cp) != 0) {
            src_err(src, src->i, "invalid escape in a string");
            return -1;
        }
        size_t at = src->i;
        src->i += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF && src->i + 6 <= src->n && src->s[src->i] == '\\'
            && src->s[src->i + 1] == 'u' && hex4(src->s + src->i + 2, &lo) == 0
            && lo >= 0xDC00 && lo <= 0xDFFF) {
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            src->i += 6;
        } else if (cp >= 0xD800 && cp <= 0xDFFF) {
            src_err(src, at, "unpaired surrogate in a string");
            return -1;
        }
        len += put_utf8(out + len, cp); /* \uXXXX (6 bytes) yields at most 4 */
    }
}

/* Makes room for ids below need (b->cap grows by doubling). */
static int grow_tokens(mesh__bpe *b, int need)
{
    if (need <= b->cap) return 0;
    int cap = 1;
    while (cap < need) cap *= 2;
    char **text = realloc(b->text, (size_t)cap * sizeof *text);
    if (!text) return -1;
    b->text = text;
    uint32_t *len = realloc(b->len, (size_t)cap * sizeof *len);
    if (!len) return -1;
    b->len = len;
    for (int k = b->cap; k < cap; k++) b->text[k] = NULL, b->len[k] = 0;
    b->cap = cap;
    return 0;
}

/* Parses {"token": id, ...} into b->text/len. */
static int load_encoder(mesh__bpe *b, bpe_src *src, const int byte_of[BPE_ALPHABET])
{
    char *buf = malloc(src->n + 1);
    if (!buf) { set_err(src->err, src->errn, "%s: out of memory", src->name); return -1; }
    int rc = -1;
    skip_ws(src);
    if (src->i >= src->n || src->s[src->i] != '{') {
        src_err(src, src->i, "expected '{' (a JSON object of token: id)");
        goto out;
    }
    src->i++;
    skip_ws(src);
    int first = 1;
    while (!(src->i < src->n && src->s[src->i] == '}' && first)) {
        size_t at = src->i;
        long len = json_string(src, buf);
        if (len < 0) goto out;
        long bytes = to_bytes(buf, (size_t)len, byte_of);
        if (bytes <= 0) {
            src_err(src, at, bytes == 0 ? "empty token"
                                        : "token has a character outside GPT-2's byte alphabet");
            goto out;
        }
        skip_ws(src);
        if (src->i >= src->n || src->s[src->i] != ':') { src_err(src, src->i, "expected ':'"); goto out; }
        src->i++;
        skip_ws(src);
        size_t id_at = src->i;
        long id = 0;
        while (src->i < src->n && src->s[src->i] >= '0' && src->s[src->i] <= '9' && id < BPE_MAX_ID)
            id = id * 10 + (src->s[src->i++] - '0');
        if (src->i == id_at || id >= BPE_MAX_ID) {
            src_err(src, id_at, "expected a token id (an integer from 0 to 16777215)");
            goto out;
        }
        if (grow_tokens(b, (int)id + 1) != 0) {
            set_err(src->err, src->errn, "%s: out of memory", src->name);
            goto out;
        }
        if (id >= b->vocab) b->vocab = (int)id + 1;
        if (b->text[id]) { src_err(src, id_at, "this id is given to two tokens"); goto out; }
        b->text[id] = malloc((size_t)bytes);
        if (!b->text[id]) { set_err(src->err, src->errn, "%s: out of memory", src->name); goto out; }
        memcpy(b->text[id], buf, (size_t)bytes);
        b->len[id] = (uint32_t)bytes;
        skip_ws(src);
        first = 0;
        if (src->i < src->n && src->s[src->i] == ',') { src->i++; skip_ws(src); continue; }
        if (src->i < src->n && src->s[src->i] == '}') break;
        src_err(src, src->i, "expected ',' or '}'");
        goto out;
    }
    src->i++;
    skip_ws(src);
    if (src->i != src->n) { src_err(src, src->i, "unexpected text after the object"); goto out; }
    if (b->vocab == 0) { src_err(src, 0, "no tokens"); goto out; }
    rc = 0;
out:
    free(buf);
    return rc;
}

/* Builds by_text and byte_id; reports duplicate tokens and missing bytes. */
static int index_tokens(mesh__bpe *b, bpe_src *src)
{
    b->by_text_mask = table_size((size_t)b->vocab) - 1;
    b->by_text = malloc((b->by_text_mask + 1) * sizeof *b->by_text);
    if (!b->by_text) { set_err(src->err, src->errn, "%s: out of memory", src->name); return -1; }
    for (size_t k = 0; k <= b->by_text_mask; k++) b->by_text[k] = -1;
    for (int id = 0; id < b->vocab; id++) {
        if (!b->text[id]) continue;
        size_t k = text_slot(b, b->text[id], b->len[id]);
        if (b->by_text[k] >= 0) {
            set_err(src->err, src->errn, "%s: error: ids %d and %d are the same token", src->name,
                    b->by_text[k], id);
            return -1;
        }
        b->by_text[k] = id;
    }
    for (int c = 0; c < 256; c++) {
        char byte = (char)c;
        b->byte_id[c] = mesh__bpe_id(b, &byte, 1);
        if (b->byte_id[c] < 0) {
            set_err(src->err, src->errn, "%s: error: no token for byte 0x%02X (a byte-level "
                    "vocabulary has all 256)", src->name, c);
            return -1;
        }
    }
    return 0;
}

/* Resolves one side of a merge line to an id (-1 after reporting). */
static int32_t merge_side(mesh__bpe *b, bpe_src *src, size_t at, size_t n, char *buf,
                          const int byte_of[BPE_ALPHABET])
{
    memcpy(buf, src->s + at, n);
    long bytes = to_bytes(buf, n, byte_of);
    int32_t id = bytes > 0 ? mesh__bpe_id(b, buf, (size_t)bytes) : -1;
    if (id < 0) src_err(src, at, "this side of the merge is not a token of encoder.json");
    return id;
}

/* Parses vocab.bpe: an optional "#version" line, then "left right" lines. */
static int load_merges(mesh__bpe *b, bpe_src *src, const int byte_of[BPE_ALPHABET])
{
    size_t lines = 1;
    for (size_t k = 0; k < src->n; k++) lines += src->s[k] == '\n';
    b->merges_mask = table_size(lines) - 1;
    b->merges = calloc(b->merges_mask + 1, sizeof *b->merges);
    char *buf = malloc(src->n + 1), *joined = NULL;
    size_t joined_cap = 0;
    int rc = -1;
    if (!b->merges || !buf) { set_err(src->err, src->errn, "%s: out of memory", src->name); goto out; }
    int32_t rank = 0;
    for (size_t line = 0; src->i < src->n; line++) {
        size_t start = src->i, end = start;
        while (end < src->n && src->s[end] != '\n') end++;
        src->i = end + (end < src->n);
        size_t stop = end;
        if (stop > start && src->s[stop - 1] == '\r') stop--;
        if (stop == start) continue;
        if (line == 0 && src->s[start] == '#') continue;
        size_t sp = start;
        while (sp < stop && src->s[sp] != ' ') sp++;
        if (sp == start || sp + 1 >= stop || memchr(src->s + sp + 1, ' ', stop - sp - 1)) {
            src_err(src, start, "expected a merge: two tokens separated by one space");
            goto out;
        }
        int32_t left = merge_side(b, src, start, sp - start, buf, byte_of);
        if (left < 0) goto out;
        int32_t right = merge_side(b, src, sp + 1, stop - sp - 1, buf, byte_of);
        if (right < 0) goto out;
        size_t n = b->len[left] + b->len[right];
        if (n > joined_cap) {
            free(joined);
            joined_cap = 2 * n;
            joined = malloc(joined_cap);
            if (!joined) { set_err(src->err, src->errn, "%s: out of memory", src->name); goto out; }
        }
        memcpy(joined, b->text[left], b->len[left]);
        memcpy(joined + b->len[left], b->text[right], b->len[right]);
        int32_t result = mesh__bpe_id(b, joined, n);
        if (result < 0) {
            src_err(src, start, "the merged token is not in encoder.json");
            goto out;
        }
        uint64_t key = ((uint64_t)left << 32 | (uint32_t)right) + 1;
        size_t k = (size_t)hash_u64(key) & b->merges_mask;
        while (b->merges[k].pair && b->merges[k].pair != key) k = (k + 1) & b->merges_mask;
        if (b->merges[k].pair) { src_err(src, start, "this merge is listed twice"); goto out; }
        b->merges[k] = (bpe_merge){key, rank++, result};
    }
    rc = 0;
out:
    free(buf);
    free(joined);
    return rc;
}

mesh__bpe *mesh__bpe_load_mem(const char *encoder, size_t encoder_len, const char *encoder_name,
                              const char *merges, size_t merges_len, const char *merges_name,
                              char *err, size_t errn)
{
    int byte_of[BPE_ALPHABET];
    alphabet(byte_of);
    mesh__bpe *b = calloc(1, sizeof *b);
    if (!b) { set_err(err, errn, "out of memory"); return NULL; }
    bpe_src enc = {encoder, encoder_name, encoder_len, 0, err, errn};
    bpe_src mer = {merges, merges_name, merges_len, 0, err, errn};
    if (load_encoder(b, &enc, byte_of) != 0 || index_tokens(b, &enc) != 0
        || load_merges(b, &mer, byte_of) != 0) {
        mesh__bpe_free(b);
        return NULL;
    }
    int code;
    PCRE2_SIZE offset;
    b->re = pcre2_compile((PCRE2_SPTR)bpe_pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                          &code, &offset, NULL);
    if (!b->re) {
        set_err(err, errn, "cannot compile the pre-tokenizer pattern (PCRE2 error %d)", code);
        mesh__bpe_free(b);
        return NULL;
    }
    return b;
}

mesh__bpe *mesh__bpe_load(const char *encoder_path, const char *merges_path, char *err,
                          size_t errn)
{
    size_t elen = 0, mlen = 0;
    char *enc = mesh__read_file(encoder_path, &elen, err, errn);
    char *mer = enc ? mesh__read_file(merges_path, &mlen, err, errn) : NULL;
    mesh__bpe *b = mer ? mesh__bpe_load_mem(enc, elen, encoder_path, mer, mlen, merges_path, err,
                                            errn)
                       : NULL;
    free(enc);
    free(mer);
    return b;
}

void mesh__bpe_free(mesh__bpe *bpe)
{
    if (!bpe) return;
    for (int id = 0; id < bpe->vocab && bpe->text; id++) free(bpe->text[id]);
    free(bpe->text);
    free(bpe->len);
    free(bpe->by_text);
    free(bpe->merges);
    pcre2_code_free(bpe->re);
    free(bpe);
}

int mesh__bpe_vocab(const mesh__bpe *bpe) { return bpe->vocab; }

/* ---- encoding ---- */

static int push(int32_t **ids, size_t *n, size_t *cap, int32_t id)
{
    if (*n == *cap) {
        size_t bigger = *cap ? *cap * 2 : 1024;
        int32_t *p = realloc(*ids, bigger * sizeof *p);
        if (!p) return -1;
        *ids = p;
        *cap = bigger;
    }
    (*ids)[(*n)++] = id;
    return 0;
}

/* BPE on one pre-token: w[0..m) holds its byte ids; merges the lowest-
 * ranked adjacent pair (every occurrence, left to right) until none has a
 * rank. Returns the new length. */
static size_t merge_piece(const mesh__bpe *b, int32_t *w, size_t m)
{
    while (m > 1) {
        const bpe_merge *best = NULL;
        for (size_t k = 0; k + 1 < m; k++) {
            const bpe_merge *mg = merge_find(b, w[k], w[k + 1]);
            if (mg && (!best || mg->rank < best->rank)) best = mg;
        }
        if (!best) break;
        int32_t left = (int32_t)((best->pair - 1) >> 32), right = (int32_t)((best->pair - 1) & 0xFFFFFFFFu);
        size_t out = 0;
        for (size_t k = 0; k < m; k++) {
            if (k + 1 < m && w[k] == left && w[k + 1] == right) {
                w[out++] = best->result;
                k++;
            } else {
                w[out++] = w[k];
            }
        }
        m = out;
    }
    return m;
}

int mesh__bpe_encode(const mesh__bpe *bpe, const char *text, size_t len, int32_t **ids,
                     size_t *n, size_t *cap, char *err, size_t errn)
{
    for (size_t k = 0; k < len;) {
        uint32_t cp;
        size_t step = utf8_next((const unsigned char *)text + k, len - k, &cp);
        if (step == 0) {
            set_err(err, errn, "the text is not valid UTF-8 at byte %zu", k);
            return -1;
        }
        k += step;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(bpe->re, NULL);
    int32_t *w = NULL;
    size_t wcap = 0;
    int rc = 0;
    if (!md) {
        set_err(err, errn, "out of memory");
        return -1;
    }
    for (size_t at = 0; rc == 0 && at < len;) {
        int got = pcre2_match(bpe->re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK, md, NULL);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (got < 0 || ov[0] != at || ov[1] <= ov[0]) {
            set_err(err, errn, "the pre-tokenizer stopped at byte %zu", at); /* cannot happen */
            rc = -1;
            break;
        }
        size_t m = ov[1] - ov[0];
        if (m > wcap) {
            free(w);
            wcap = 2 * m;
            w = malloc(wcap * sizeof *w);
            if (!w) {
                set_err(err, errn, "out of memory");
                rc = -1;
                break;
            }
        }
        for (size_t k = 0; k < m; k++) w[k] = bpe->byte_id[(unsigned char)text[at + k]];
        m = merge_piece(bpe, w, m);
        for (size_t k = 0; rc == 0 && k < m; k++) rc = push(ids, n, cap, w[k]);
        if (rc != 0) set_err(err, errn, "out of memory");
        at = ov[1];
    }
    free(w);
    pcre2_match_data_free(md);
    return rc;
}

size_t mesh__bpe_decode(const mesh__bpe *bpe, const int32_t *ids, size_t n, char *out,
                        size_t cap)
{
    size_t total = 0;
    for (size_t k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] >= bpe->vocab || !bpe->text[ids[k]]) continue;
        size_t len = bpe->len[ids[k]];
        if (total < cap) memcpy(out + total, bpe->text[ids[k]], len < cap - total ? len : cap - total);
        total += len;
    }
    return total;
}
