/*
 * version.c: the library's version, from the macros in mesh.h.
 *
 * The string and the number are fixed when libmesh is compiled, so a program
 * can compare them with the header it was compiled against.
 */
#include "mesh.h" /* defines: MESH_VERSION_*, mesh_version, mesh_version_num */

#define MESH_STR_(x) #x
#define MESH_XSTR_(x) MESH_STR_(x)

const char *mesh_version(void)
{
    return MESH_XSTR_(MESH_VERSION_MAJOR) "." MESH_XSTR_(MESH_VERSION_MINOR) "."
        MESH_XSTR_(MESH_VERSION_PATCH);
}

int mesh_version_num(void)
{
    return MESH_VERSION_NUM;
}
