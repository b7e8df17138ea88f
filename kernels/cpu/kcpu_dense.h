/* kcpu_dense.h — see kcpu.h. */
#ifndef MESH_KCPU_DENSE_H
#define MESH_KCPU_DENSE_H

#endif
