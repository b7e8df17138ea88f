/* kcpu_attention.h — see kcpu.h. */
#ifndef MESH_KCPU_ATTENTION_H
#define MESH_KCPU_ATTENTION_H

#endif
