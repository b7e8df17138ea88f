/* rope.c — rotary position embedding, rotate-half layout (GPT-NeoX, Hugging
 * Face Llama): channel j < d/2 of a head pairs with j + d/2, and the pair
 * turns by the angle (pos0 + t) * theta^(-2j/d). Angles are computed in
 * double, once per (t, j). */
#include <math.h> /* defines: pow, cos, sin */

#include "kcpu_attention.h"

/* The rotation of pair j at position pos. */
static void rope_angle(double *c, double *s, int pos, int j, int d,
                       float theta)
{
    double a = (double)pos * pow((double)theta, -2.0 * j / d);
    *c = cos(a);
    *s = sin(a);
}

/* Rotates each (j, j + d/2) pair of every head by its angle: forward
 * (sign +1, writing out) or, for the backward, by the opposite angle
 * (sign -1, adding into out). in and out may be the same buffer forward. */
static void rotate(float *out, const float *in, int B, int T, int H, int d, float theta, int pos0, int sign)
{
    int half = d / 2, C = H * d;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < half; j++) {
            double c, s;
            rope_angle(&c, &s, pos0 + t, j, d, theta);
            s *= sign;
            for (int b = 0; b < B; b++)
                for (int h = 0; h < H; h++) {
                    long o = ((long)b * T + t) * C + (long)h * d + j;
                    double x0 = in[o], x1 = in[o + half];
                    float y0 = (float)(x0 * c - x1 * s), y1 = (float)(x0 * s + x1 * c);
                    if (sign > 0) {
                        out[o] = y0;
                        out[o + half] = y1;
                    } else {
                        out[o] += y0;
                        out[o + half] += y1;
                    }
                }
        }
}

void kcpu_rope_forward(float *out, const float *x, int B, int T, int H,
                       int d, float theta, int pos0)
{
    rotate(out, x, B, T, H, d, theta, pos0, +1);
}

/* The inverse rotation of dout, added into dx. */
void kcpu_rope_backward(float *dx, const float *dout, int B, int T, int H,
                        int d, float theta, int pos0)
{
    rotate(dx, dout, B, T, H, d, theta, pos0, -1);
}
