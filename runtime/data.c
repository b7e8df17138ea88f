/* data.c — token shards and the byte tokenizer (data.h). */
#define _DEFAULT_SOURCE /* MAP_PRIVATE */
#include "data.h"

#include <errno.h>    /* errno */
#include <fcntl.h>    /* open */
#include <stdio.h>    /* snprintf, fopen */
#include <string.h>   /* memcpy, strerror */
#include <sys/mman.h> /* mmap */
#include <sys/stat.h> /* fstat */
#include <unistd.h>   /* close */

static int32_t le32(const unsigned char *p) {
    return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

int mesh__shard_open(mesh__shard *s, const char *path, int vocab, char *err, size_t n) {
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, n, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, n, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    size_t len = (size_t)st.st_size;
    if (len < MESH_SHARD_HEADER_INTS * 4) {
        snprintf(err, n, "%s: %zu bytes, shorter than a shard's 1024-byte header", path, len);
        close(fd);
        return -1;
    }
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(err, n, "%s: cannot map: %s", path, strerror(errno));
        return -1;
    }
    const unsigned char *h = map;
    int32_t magic = le32(h), version = le32(h + 4), count = le32(h + 8);
    const char *why = NULL;
    char buf[160];
    if (magic != MESH_SHARD_MAGIC) {
        snprintf(buf, sizeof buf, "not a token shard (magic %d, not %d)", magic, MESH_SHARD_MAGIC);
        why = buf;
    } else if (version != MESH_SHARD_VERSION) {
        snprintf(buf, sizeof buf, "shard version %d; this build reads version %d (uint16 tokens)", version,
                 MESH_SHARD_VERSION);
        why = buf;
    } else if (count < 0 || len != MESH_SHARD_HEADER_INTS * 4 + (size_t)count * 2) {
        snprintf(buf, sizeof buf, "the header says %d tokens (%zu bytes), but the file has %zu bytes: truncated "
                 "or corrupted", count, MESH_SHARD_HEADER_INTS * 4 + (size_t)(count < 0 ? 0 : count) * 2, len);
        why = buf;
    }
    if (!why && count < 2) why = "fewer than 2 tokens";
    const uint16_t *tok = (const uint16_t *)(h + MESH_SHARD_HEADER_INTS * 4);
    for (int32_t i = 0; !why && vocab > 0 && i < count; i++)
        if (tok[i] >= vocab) {
            snprintf(buf, sizeof buf, "token %d at position %d is outside the model's vocabulary of %d", tok[i], i,
                     vocab);
            why = buf;
        }
    if (why) {
        snprintf(err, n, "%s: %s", path, why);
        munmap(map, len);
        return -1;
    }
    s->tokens = tok;
    s->n = (size_t)count;
    s->map = map;
    s->map_len = len;
    return 0;
}

void mesh__shard_close(mesh__shard *s) {
    if (s->map) munmap(s->map, s->map_len);
    memset(s, 0, sizeof *s);
}

int mesh__shard_write(const char *path, const uint16_t *tokens, size_t n, char *err, size_t errn) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (n > 0x7fffffff) {
        snprintf(err, errn, "%s: %zu tokens do not fit one shard", path, n);
        return -1;
    }
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        snprintf(err, errn, "%s: cannot write: %s", tmp, strerror(errno));
        return -1;
    }
    unsigned char h[MESH_SHARD_HEADER_INTS * 4] = {0};
    const int32_t head[3] = {MESH_SHARD_MAGIC, MESH_SHARD_VERSION, (int32_t)n};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) h[i * 4 + b] = (unsigned char)((uint32_t)head[i] >> (8 * b));
    int ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    for (size_t i = 0; ok && i < n; i++) {
        unsigned char t[2] = {(unsigned char)tokens[i], (unsigned char)(tokens[i] >> 8)};
        ok = fwrite(t, 1, 2, f) == 2;
    }
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        snprintf(err, errn, "%s: cannot write: %s", path, strerror(errno));
        remove(tmp);
        return -1;
    }
    return 0;
}

size_t mesh__tokenize_bytes(const char *text, size_t len, int32_t *out) {
    for (size_t i = 0; i < len; i++) out[i] = (unsigned char)text[i];
    return len;
}

void mesh__batch(const mesh__shard *s, long long step, int global, int ranks, int rank, int seq, int32_t *inputs,
                 int32_t *targets) {
    int per = global / ranks;
    /* windows of seq + 1 tokens, wrapping around the shard */
    size_t windows = (s->n - 1) / (size_t)seq;
    for (int i = 0; i < per; i++) {
        size_t g = (size_t)((step * global + (long long)rank * per + i) % (long long)windows);
        const uint16_t *w = s->tokens + g * (size_t)seq;
        for (int t = 0; t < seq; t++) {
            inputs[i * seq + t] = w[t];
            targets[i * seq + t] = w[t + 1];
        }
    }
}
