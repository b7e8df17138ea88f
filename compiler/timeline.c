/* timeline.c — SVG timeline of a simulated pipeline schedule (see
 * timeline.h). Layout in pixels: a title band, one row per stage, a time
 * axis, a legend. Coordinates are printed with "%.2f" and times with
 * "%.2f", so equal inputs give byte-identical files.
 */
#include "timeline.h"

#include <math.h>   /* floor, log10, pow */
#include <stdlib.h> /* malloc, calloc, free */

enum { LEFT = 80, RIGHT = 20, TOP = 56, ROW_H = 28, ROW_GAP = 6, PLOT_W = 960, AXIS_H = 34, LEGEND_H = 30 };

/* Forward and backward fills by local chunk (chunk / pp), cycling; text on
 * the first shade is white, on the lighter ones near-black. */
static const char *const fwd_fill[] = {"#3a6ea5", "#79a6d6", "#aecbea"};
static const char *const bwd_fill[] = {"#c8612b", "#eb9b63", "#f5c6a0"};

static const char *title_kind(sched_kind k) {
    switch (k) {
    case SCHED_KIND_GPIPE: return "GPipe";
    case SCHED_KIND_1F1B: return "1F1B";
    case SCHED_KIND_INTERLEAVED: return "Interleaved 1F1B";
    }
    return "?";
}

/* A round tick step (1, 2 or 5 times a power of ten) giving about 10
 * ticks over span. */
static double tick_step(double span) {
    double raw = span / 10, p = pow(10, floor(log10(raw))), f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
}

static void header(FILE *out, const sched *s, double tf, double tb, double makespan, double bubble,
                   int width, int height) {
    fprintf(out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\" font-size=\"11\">\n",
            width, height, width, height);
    fprintf(out, "<title>%s schedule, pp=%d m=%d v=%d, bubble %.2f%%</title>\n", title_kind(s->kind), s->pp,
            s->m, s->v, 100 * bubble);
    fputs("<defs>\n"
          "<pattern id=\"idle\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
          "patternTransform=\"rotate(45)\">"
          "<rect width=\"6\" height=\"6\" fill=\"#f2f2f2\"/>"
          "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#cccccc\" stroke-width=\"2\"/></pattern>\n"
          "</defs>\n"
          "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
          out);
    fprintf(out,
            "<text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">%s schedule: pp=%d, m=%d, v=%d"
            " - bubble %.2f%%</text>\n",
            title_kind(s->kind), s->pp, s->m, s->v, 100 * bubble);
    fprintf(out,
            "<text x=\"10\" y=\"42\" fill=\"#555555\">forward %.2f, backward %.2f per unit; makespan %.2f;"
            " bubble = idle share of the busiest stage</text>\n",
            tf, tb, makespan);
}

/* One unit: its box, a tooltip, and the label when it fits (in a smaller
 * font if need be; the tooltip always has it). */
static void unit_box(FILE *out, const sched *s, const sched_unit *u, double x, double w, int y) {
    int bwd = u->op == SCHED_BWD, shade = (u->chunk / s->pp) % 3;
    char label[32];
    int n = s->v > 1 ? snprintf(label, sizeof label, "%d.%d", u->micro, u->chunk)
                     : snprintf(label, sizeof label, "%d", u->micro);
    fprintf(out,
            "<rect x=\"%.2f\" y=\"%d\" width=\"%.2f\" height=\"%d\" fill=\"%s\" stroke=\"#ffffff\" "
            "stroke-width=\"0.5\"><title>%s micro %d chunk %d</title></rect>\n",
            x, y, w, ROW_H, bwd ? bwd_fill[shade] : fwd_fill[shade], bwd ? "backward" : "forward", u->micro,
            u->chunk);
    /* About 6.5 px a character at the default 11 px, 4.8 at 8 px. */
    const char *small = w >= 6.5 * n + 2 ? "" : w >= 4.8 * n + 1 ? " font-size=\"8\"" : NULL;
    if (small)
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\"%s fill=\"%s\">%s</text>\n", x + w / 2,
                y + ROW_H / 2 + 4, small, shade ? "#1a1a1a" : "#ffffff", label);
}

static void rows(FILE *out, const sched *s, double *const *start, double *const *end, double scale) {
    for (int st = 0; st < s->pp; st++) {
        int y = TOP + st * (ROW_H + ROW_GAP);
        fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">stage %d</text>\n", LEFT - 8,
                y + ROW_H / 2 + 4, st);
        fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"url(#idle)\"/>\n", LEFT, y,
                PLOT_W, ROW_H);
        for (int i = 0; i < s->stages[st].n_units; i++) {
            const sched_unit *u = &s->stages[st].units[i];
            if (u->op != SCHED_FWD && u->op != SCHED_BWD) continue;
            unit_box(out, s, u, LEFT + start[st][i] * scale, (end[st][i] - start[st][i]) * scale, y);
        }
    }
}

static void axis(FILE *out, int y, double makespan, double scale) {
    fprintf(out, "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#333333\"/>\n", LEFT, y, LEFT + PLOT_W,
            y);
    if (makespan <= 0) return;
    double step = tick_step(makespan);
    for (int k = 0; k * step <= makespan * (1 + 1e-9); k++) {
        double x = LEFT + k * step * scale;
        fprintf(out, "<line x1=\"%.2f\" y1=\"%d\" x2=\"%.2f\" y2=\"%d\" stroke=\"#333333\"/>\n", x, y, x, y + 4);
        fprintf(out, "<text x=\"%.2f\" y=\"%d\" text-anchor=\"middle\" fill=\"#333333\">%.4g</text>\n", x,
                y + 16, k * step);
    }
    fprintf(out, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"#333333\">time</text>\n", LEFT - 8,
            y + 16);
}

static void legend(FILE *out, const sched *s, int y) {
    static const char *const name[] = {"forward", "backward", "idle"};
    const char *fill[] = {fwd_fill[0], bwd_fill[0], "url(#idle)"};
    for (int i = 0; i < 3; i++) {
        int x = LEFT + i * 110;
        fprintf(out, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\" stroke=\"#999999\"/>\n", x, y,
                fill[i]);
        fprintf(out, "<text x=\"%d\" y=\"%d\">%s</text>\n", x + 20, y + 11, name[i]);
    }
    if (s->v > 1)
        fprintf(out, "<text x=\"%d\" y=\"%d\">lighter shades: later virtual chunks; labels are micro.chunk</text>\n",
                LEFT + 330, y + 11);
}

int timeline_svg(const sched *s, double tf, double tb, FILE *out) {
    if (!s || !s->stages || !out || !(tf >= 0) || !(tb >= 0)) return -1;
    double **start = calloc((size_t)s->pp, sizeof *start), **end = calloc((size_t)s->pp, sizeof *end);
    int rc = -1;
    if (!start || !end) goto done;
    for (int st = 0; st < s->pp; st++) {
        size_t n = (size_t)s->stages[st].n_units + 1;
        start[st] = malloc(n * sizeof **start);
        end[st] = malloc(n * sizeof **end);
        if (!start[st] || !end[st]) goto done;
    }
    double bubble, makespan = sched_simulate_units(s, tf, tb, start, end, &bubble);
    if (makespan < 0) goto done;
    double scale = makespan > 0 ? PLOT_W / makespan : 0;
    int rows_h = s->pp * (ROW_H + ROW_GAP);
    int width = LEFT + PLOT_W + RIGHT, height = TOP + rows_h + AXIS_H + LEGEND_H;
    header(out, s, tf, tb, makespan, bubble, width, height);
    rows(out, s, start, end, scale);
    axis(out, TOP + rows_h, makespan, scale);
    legend(out, s, TOP + rows_h + AXIS_H);
    fputs("</svg>\n", out);
    rc = ferror(out) ? -1 : 0;
done:
    for (int st = 0; start && end && st < s->pp; st++) {
        free(start[st]);
        free(end[st]);
    }
    free(start);
    free(end);
    return rc;
}
