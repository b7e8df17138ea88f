/*
 * gpu_tests_moe.c: mixture of experts against kcpu's: the routing
 * (top-k, capacity, the integer arrays bit for bit), dispatch, the
 * experts' products and combine, forward and backward.
 */
#include <string.h> /* defines: memcpy */

#include "gpu_tests.h"

/* ---- cases: mixture of experts -------------------------------------------- */

void t_moe(kcuda_dtype dt)
{
    int N = 40, E = 6, K = 2, D = 16, F = 24;
    int C = kcpu_moe_capacity(N, E, K, 1.0);
    double keep = cur_tol;
    /* routing is fp32 */
    cur_tol = TOL_F32;
    float *x = rnd((size_t)N * D, 1.0f, dt), *router = rnd((size_t)D * E, 1.0f,
                                                           KCUDA_F32);
    kcpu_moe_route *cr = kcpu_moe_route_alloc(N, E, K, C);
    if (!cr) {
        cur_bad = 1;
        fprintf(stderr, "# kcpu_moe_route_alloc failed\n");
        return;
    }
    kcpu_moe_route_forward(cr, x, router, D);
    kcuda_moe_route gr;
    void *mem = dmem(kcuda_moe_route_bytes(N, E, K, C));
    KC(kcuda_moe_route_bind(&gr, mem, N, E, K, C));
    float *dx32 = up(x, (size_t)N * D, KCUDA_F32);
    float *drouter = up(router, (size_t)D * E, KCUDA_F32);
    KC(kcuda_moe_route_forward(ctx, &gr, dx32, drouter, D, NULL));
    expect_dev("probs", gr.probs, cr->probs, (size_t)N * E, KCUDA_F32);
    expect_dev("weight", gr.weight, cr->weight, (size_t)N * K, KCUDA_F32);
    expect_ints("expert", down_raw(gr.expert, (size_t)N * K * 4), cr->expert,
                (size_t)N * K);
    expect_ints("slot", down_raw(gr.slot, (size_t)N * K * 4), cr->slot,
                (size_t)N * K);
    expect_ints("token", down_raw(gr.token, (size_t)E * C * 4), cr->token,
                (size_t)E * C);
    expect_ints("count", down_raw(gr.count, (size_t)E * 4), cr->count,
                (size_t)E);
    expect_ints("chosen", down_raw(gr.chosen, (size_t)E * 4), cr->chosen,
                (size_t)E);
    expect_ints("dropped", down_raw(gr.dropped, 4), &cr->dropped, 1);
    expect_dev("aux", gr.aux, &cr->aux, 1, KCUDA_F32);
    /* routing backward */
    float *dwt = rnd((size_t)N * K, 1.0f, KCUDA_F32);
    float *gx = rnd((size_t)N * D, 0.5f, KCUDA_F32);
    float *grt = rnd((size_t)D * E, 0.5f, KCUDA_F32);
    float *scratch = hf((size_t)N * E);
    float *ddwt = up(dwt, (size_t)N * K, KCUDA_F32);
    float *dgx = up(gx, (size_t)N * D, KCUDA_F32);
    float *dgrt = up(grt, (size_t)D * E, KCUDA_F32);
    float *dscr = dmem((size_t)N * E * 4);
    kcpu_moe_route_backward(gx, grt, scratch, dwt, 0.01f, cr, x, router, D);
    KC(kcuda_moe_route_backward(ctx, dgx, dgrt, dscr, ddwt, 0.01f, &gr, dx32,
                                drouter, D, NULL));
    expect_dev("route dx", dgx, gx, (size_t)N * D, KCUDA_F32);
    expect_dev("route drouter", dgrt, grt, (size_t)D * E, KCUDA_F32);
    cur_tol = keep;

    /* dispatch, experts, combine, and back */
    size_t ecd = (size_t)E * C * D, ecf = (size_t)E * C * F;
    float *xe = hf(ecd), *ye = hf(ecd), *y = hf((size_t)N * D);
    float *hg = hf(ecf), *hu = hf(ecf), *act = hf(ecf);
    float *wg = rnd((size_t)E * D * F, 0.5f, dt), *wu = rnd((size_t)E * D * F, 0.5f, dt);
    float *wd = rnd((size_t)E * F * D, 0.5f, dt);
    void *dxd = up(x, (size_t)N * D, dt), *dxe = dmem(ecd * 4);
    void *dye = dmem(ecd * 4), *dy = dmem((size_t)N * D * 4);
    void *dhg = dmem(ecf * 4), *dhu = dmem(ecf * 4), *dact = dmem(ecf * 4);
    void *dwg = up(wg, (size_t)E * D * F, dt), *dwu = up(wu, (size_t)E * D * F, dt);
    void *dwd = up(wd, (size_t)E * F * D, dt);
    kcpu_moe_dispatch_forward(xe, x, cr, D);
    KC(kcuda_moe_dispatch_forward(dxe, dxd, &gr, D, dt, NULL));
    expect_dev("xe", dxe, xe, ecd, dt);
    kcpu_moe_expert_forward(ye, hg, hu, act, xe, wg, wu, wd, cr->count, E, C,
                            D, F);
    KC(kcuda_moe_expert_forward(ctx, dye, dhg, dhu, dact, dxe, dwg, dwu, dwd,
                                gr.count, E, C, D, F, dt, NULL));
    expect_dev("ye", dye, ye, ecd, dt);
    { /* hg, hu, act on the rows the CPU computes */
        float *g_hg = down(dhg, ecf, dt), *g_act = down(dact, ecf, dt);
        for (int e = 0; e < E; e++) {
            size_t o = (size_t)e * C * F, len = (size_t)cr->count[e] * F;
            expect("hg", g_hg + o, hg + o, len);
            expect("act", g_act + o, act + o, len);
        }
    }
    if (dt != KCUDA_F32)
        kcpu_round(ye, ecd, prec_of(dt)); /* the combine reads the stored ye */
    kcpu_moe_combine_forward(y, ye, cr, D);
    KC(kcuda_moe_combine_forward(dy, dye, &gr, D, dt, NULL));
    expect_dev("y", dy, y, (size_t)N * D, dt);

    float *gy = rnd((size_t)N * D, 1.0f, dt), *gye = rnd(ecd, 0.5f, dt);
    float *gw = rnd((size_t)N * K, 0.5f, KCUDA_F32);
    void *dgy = up(gy, (size_t)N * D, dt), *dgye = up(gye, ecd, dt);
    float *dgw = up(gw, (size_t)N * K, KCUDA_F32);
    kcpu_moe_combine_backward(gye, gw, gy, ye, cr, D);
    KC(kcuda_moe_combine_backward(dgye, dgw, dgy, dye, &gr, D, dt, NULL));
    expect_dev("dye", dgye, gye, ecd, dt);
    expect_dev("dweight", dgw, gw, (size_t)N * K, KCUDA_F32);

    float *gxe = rnd(ecd, 0.5f, dt), *gwg = rnd((size_t)E * D * F, 0.5f, dt);
    float *gwu = rnd((size_t)E * D * F, 0.5f, dt), *gwd = rnd((size_t)E * F * D, 0.5f, dt);
    float *escr = hf((size_t)2 * C * F);
    void *dgxe = up(gxe, ecd, dt), *dgwg = up(gwg, (size_t)E * D * F, dt);
    void *dgwu = up(gwu, (size_t)E * D * F, dt), *dgwd = up(gwd, (size_t)E * F * D, dt);
    /* the backward reads the device's dye (rounded in bf16) and the
     * forward's saved tensors; give the CPU the same */
    float *gye_dev = down(dgye, ecd, dt);
    float *hg_dev = down(dhg, ecf, dt), *hu_dev = down(dhu, ecf, dt);
    float *act_dev = down(dact, ecf, dt), *xe_dev = down(dxe, ecd, dt);
    kcpu_moe_expert_backward(gxe, gwg, gwu, gwd, escr, gye_dev, hg_dev, hu_dev,
                             act_dev, xe_dev, wg, wu, wd, cr->count, E, C, D,
                             F);
    KC(kcuda_moe_expert_backward(ctx, dgxe, dgwg, dgwu, dgwd, dgye, dhg, dhu,
                                 dact, dxe, dwg, dwu, dwd, gr.count, E, C, D,
                                 F, dt, NULL));
    expect_dev("dxe", dgxe, gxe, ecd, dt);
    expect_dev("dw_gate", dgwg, gwg, (size_t)E * D * F, dt);
    expect_dev("dw_up", dgwu, gwu, (size_t)E * D * F, dt);
    expect_dev("dw_down", dgwd, gwd, (size_t)E * F * D, dt);

    float *gx2 = rnd((size_t)N * D, 0.5f, dt);
    void *dgx2 = up(gx2, (size_t)N * D, dt);
    float *gxe_dev = down(dgxe, ecd, dt);
    kcpu_moe_dispatch_backward(gx2, gxe_dev, cr, D);
    KC(kcuda_moe_dispatch_backward(dgx2, dgxe, &gr, D, dt, NULL));
    expect_dev("dispatch dx", dgx2, gx2, (size_t)N * D, dt);
    kcpu_moe_route_free(cr);
}
