/* tokenizer.c — the public tokenizers (mesh_tokenizer_* in mesh.h): bytes,
 * or GPT-2's BPE over bpe.h.
 *
 * The byte-level tokenizer gives one id per byte (vocabulary 256) and has
 * no end-of-text token; GPT-2's comes from OpenAI's encoder.json and
 * vocab.bpe in one folder. Neither gives more ids than the text has bytes,
 * which is what lets callers size the buffer of mesh_tokenizer_encode.
 */
#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* calloc, free */
#include <string.h> /* strlen, strstr, memcpy */

#include "api_impl.h" /* mesh__fail */
#include "bpe.h"      /* mesh__bpe_* */

struct mesh_tokenizer {
    mesh__bpe *bpe; /* NULL: bytes */
};

mesh_status mesh_tokenizer_load(const char *dir, mesh_tokenizer **out)
{
    if (!out) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_tokenizer_load: NULL argument");
    *out = NULL;
    mesh_tokenizer *tok = calloc(1, sizeof *tok);
    if (!tok) return mesh__fail(MESH_ERR_NOMEM, "out of memory");
    if (dir) {
        char err[1024], enc[4200], mer[4200];
        snprintf(enc, sizeof enc, "%s/encoder.json", dir);
        snprintf(mer, sizeof mer, "%s/vocab.bpe", dir);
        tok->bpe = mesh__bpe_load(enc, mer, err, sizeof err);
        if (!tok->bpe) {
            free(tok);
            return mesh__fail(strstr(err, "out of memory")                              ? MESH_ERR_NOMEM
                              : strstr(err, "cannot open") || strstr(err, "cannot read") ? MESH_ERR_IO
                                                                                         : MESH_ERR_PARSE,
                              "%s", err);
        }
    }
    *out = tok;
    return MESH_OK;
}

void mesh_tokenizer_free(mesh_tokenizer *tok)
{
    if (!tok) return;
    mesh__bpe_free(tok->bpe);
    free(tok);
}

mesh_status mesh_tokenizer_info(const mesh_tokenizer *tok, int *vocab, int *eot)
{
    if (!tok) return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_tokenizer_info: NULL tokenizer");
    if (vocab) *vocab = tok->bpe ? mesh__bpe_vocab(tok->bpe) : 256;
    if (eot) *eot = tok->bpe ? mesh__bpe_id(tok->bpe, "<|endoftext|>", 13) : -1;
    return MESH_OK;
}

mesh_status mesh_tokenizer_encode(const mesh_tokenizer *tok, const char *text, size_t len, int *ids, size_t cap,
                                  size_t *n)
{
    if (!tok || (!text && len) || (!ids && cap) || !n)
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_tokenizer_encode: NULL argument");
    *n = 0;
    if (!tok->bpe) { /* bytes */
        *n = len;
        if (cap < len) return mesh__fail(MESH_ERR_INVALID_ARG, "%zu ids do not fit %zu", len, cap);
        for (size_t k = 0; k < len; k++) ids[k] = (unsigned char)text[k];
        return MESH_OK;
    }
    int32_t *got = NULL;
    size_t used = 0, room = 0;
    char err[256];
    if (mesh__bpe_encode(tok->bpe, text, len, &got, &used, &room, err, sizeof err) != 0) {
        free(got);
        return mesh__fail(strstr(err, "memory") ? MESH_ERR_NOMEM : MESH_ERR_PARSE, "%s", err);
    }
    *n = used;
    mesh_status st = MESH_OK;
    if (used > cap) st = mesh__fail(MESH_ERR_INVALID_ARG, "%zu ids do not fit %zu", used, cap);
    else if (used) memcpy(ids, got, used * sizeof *ids);
    free(got);
    return st;
}

mesh_status mesh_tokenizer_decode(const mesh_tokenizer *tok, const int *ids, size_t n, char *out, size_t cap,
                                  size_t *len)
{
    if (!tok || (!ids && n) || (!out && cap) || !len)
        return mesh__fail(MESH_ERR_INVALID_ARG, "mesh_tokenizer_decode: NULL argument");
    if (tok->bpe) {
        *len = mesh__bpe_decode(tok->bpe, (const int32_t *)ids, n, out, cap);
        return MESH_OK;
    }
    size_t total = 0;
    for (size_t k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] > 255) continue;
        if (total < cap) out[total] = (char)ids[k];
        total++;
    }
    *len = total;
    return MESH_OK;
}
