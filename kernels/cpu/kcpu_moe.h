/* kcpu_moe.h — see kcpu.h. */
#ifndef MESH_KCPU_MOE_H
#define MESH_KCPU_MOE_H

#endif
