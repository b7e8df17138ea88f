/* timeline.h — a pipeline schedule drawn as an SVG timeline.
 *
 * One row per stage, time on x: forward units in blue, backward in orange
 * (later virtual chunks in lighter shades), labelled with the micro-batch
 * ("3", or "3.5" = micro 3, chunk 5 when v > 1), idle time hatched grey.
 * A title gives kind, pp, m, v and the bubble fraction; a legend and a time
 * axis follow. Each unit carries a <title> tooltip. The file is
 * self-contained (no scripts, no external references) and deterministic:
 * every number is printed with a fixed format, so it can be golden-tested.
 */
#ifndef MESH_TIMELINE_H
#define MESH_TIMELINE_H

#include <stdio.h> /* FILE */

#include "sched.h" /* sched */

/* Simulates s with forward cost tf and backward cost tb per unit (see
 * sched_simulate) and writes the SVG to out. Returns 0, or -1 when the
 * costs are negative, the schedule cannot complete, or writing fails. */
int timeline_svg(const sched *s, double tf, double tb, FILE *out);

#endif
