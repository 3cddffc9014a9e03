/*
 * Per-row steering and readout on llama.cpp's residual stream.
 *
 * llama.cpp names the residual stream after block il "l_out-<il>" and, when
 * a context has an eval callback (llama_context_params.cb_eval), asks it of
 * every graph node before computing: a node the callback wants is computed,
 * handed to it (on the CPU backend its data is host memory), and only then
 * do later nodes read it. That is where this callback adds each token's own
 * steering vector, and copies out the rows a request reads (activations,
 * monitoring probes) before and after that add.
 *
 * Python (engines/gguf/steering.py) owns every buffer and fills them before
 * each llama_decode: per layer, each batch token's edits (clamp, ablate: a
 * linear reading of the stream moved to a target), vector index (or -1) and
 * capture rows (or -1). The callback only reads those tables; it allocates
 * nothing and never calls back into Python, so a step costs one comparison
 * per graph node plus the adds themselves. With `active` 0 it asks for no
 * node, and llama.cpp computes the graph in one piece as without it.
 */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ggml.h"

enum { IDLE = 0, APPLY = 1, DISCOVER = 2 };

typedef struct {
    int32_t n_embd;
    int32_t n_layer;
    int32_t mode;          /* IDLE, APPLY or DISCOVER */
    int32_t n_tokens;      /* tokens in this decode's batch */
    int32_t n_outputs;     /* of them, those with logits (the last block keeps only these) */
    int32_t cap;           /* rows of each per-layer table (the batch capacity) */
    int32_t errors;        /* tensors seen with an unexpected layout */
    int32_t applied;       /* l_out tensors handed to the callback this decode */
    const int32_t *out_tokens;   /* [cap]: batch index of each output, in order */
    const uint8_t *layer_on;     /* [n_layer] */
    const float *vectors;        /* [*, n_embd] */
    const int32_t *token_vector; /* [n_layer, cap]: vector row or -1 */
    const int32_t *token_pre;    /* [n_layer, cap]: row of pre_buf or -1 */
    const int32_t *token_post;   /* [n_layer, cap]: row of post_buf or -1 */
    float *pre_buf;              /* [cap, n_embd] */
    float *post_buf;             /* [cap, n_embd] */
    uint8_t *seen;               /* [n_layer]: DISCOVER marks reachable layers */
    const int32_t *token_edit;   /* [n_layer, cap]: first edit row or -1 */
    const int32_t *token_edits;  /* [n_layer, cap]: how many edits from there */
    const float *edit_read;      /* [*, n_embd] */
    const float *edit_move;      /* [*, n_embd] */
    const float *edit_args;      /* [*, 3]: bias, target, above */
} millm_steer;

static int layer_of(const char *name) {
    if (strncmp(name, "l_out-", 6) != 0) {
        return -1;
    }
    int il = 0;
    const char *p = name + 6;
    if (*p < '0' || *p > '9') {
        return -1;
    }
    for (; *p >= '0' && *p <= '9'; p++) {
        il = il * 10 + (*p - '0');
        if (il > 1 << 20) {
            return -1;
        }
    }
    return *p == '\0' ? il : -1;
}

static bool usable(const millm_steer *s, const struct ggml_tensor *t) {
    return t->type == GGML_TYPE_F32 && t->ne[0] == s->n_embd && t->ne[2] == 1 &&
           t->ne[3] == 1 && t->nb[0] == sizeof(float) &&
           t->nb[1] == (size_t)s->n_embd * sizeof(float);
}

bool millm_steer_eval(struct ggml_tensor *t, bool ask, void *user_data) {
    millm_steer *s = (millm_steer *)user_data;
    if (s == NULL || s->mode == IDLE) {
        return ask ? false : true;
    }
    int il = layer_of(t->name);
    if (il < 0 || il >= s->n_layer) {
        return ask ? false : true;
    }
    if (s->mode == DISCOVER) {
        if (ask && usable(s, t)) {
            s->seen[il] = 1;
        }
        return ask ? false : true;
    }
    if (!s->layer_on[il]) {
        return ask ? false : true;
    }
    if (ask) {
        return true;
    }
    /* Returning false would stop the graph: every path below answers true. */
    s->applied++;
    if (!usable(s, t) || t->data == NULL) {
        s->errors++;
        return true;
    }
    int64_t cols = t->ne[1];
    const int32_t *to_token = NULL;
    if (cols == s->n_tokens) {
        to_token = NULL;
    } else if (cols == s->n_outputs) {
        to_token = s->out_tokens;
    } else {
        s->errors++;
        return true;
    }
    const int n = s->n_embd;
    const int32_t *vec = s->token_vector + (size_t)il * s->cap;
    const int32_t *pre = s->token_pre + (size_t)il * s->cap;
    const int32_t *post = s->token_post + (size_t)il * s->cap;
    const int32_t *edit = s->token_edit + (size_t)il * s->cap;
    const int32_t *edits = s->token_edits + (size_t)il * s->cap;
    float *data = (float *)t->data;
    for (int64_t c = 0; c < cols; c++) {
        int32_t token = to_token ? to_token[c] : (int32_t)c;
        if (token < 0 || token >= s->cap) {
            s->errors++;
            continue;
        }
        float *x = data + c * n;
        if (pre[token] >= 0) {
            memcpy(s->pre_buf + (size_t)pre[token] * n, x, n * sizeof(float));
        }
        /* Edits (steering/plan.py Edit), in order: a reading set to a target. */
        for (int32_t e = edit[token]; e >= 0 && e < edit[token] + edits[token]; e++) {
            const float *r = s->edit_read + (size_t)e * n;
            const float *args = s->edit_args + (size_t)e * 3;
            float reading = args[0];
            for (int i = 0; i < n; i++) {
                reading += x[i] * r[i];
            }
            if (reading > args[2]) {
                const float shift = args[1] - reading;
                const float *m = s->edit_move + (size_t)e * n;
                for (int i = 0; i < n; i++) {
                    x[i] += shift * m[i];
                }
            }
        }
        if (vec[token] >= 0) {
            const float *v = s->vectors + (size_t)vec[token] * n;
            for (int i = 0; i < n; i++) {
                x[i] += v[i];
            }
        }
        if (post[token] >= 0) {
            memcpy(s->post_buf + (size_t)post[token] * n, x, n * sizeof(float));
        }
    }
    return true;
}
