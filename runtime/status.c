/*
 * status.c: messages for mesh_status codes.
 *
 * The switch is generated from MESH_STATUS_LIST, so a code added to the list
 * gets its message here with no second table to keep in step.
 */
#include "mesh.h" /* defines: mesh_status, MESH_STATUS_LIST, mesh_status_str */

const char *mesh_status_str(mesh_status status)
{
    switch (status) {
#define MESH_STATUS_CASE_(name, message) \
    case MESH_##name:                    \
        return message;
        MESH_STATUS_LIST(MESH_STATUS_CASE_)
#undef MESH_STATUS_CASE_
    }
    /* Not in the list: a caller cast some other int to mesh_status. */
    return "unknown status";
}
