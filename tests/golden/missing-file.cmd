$MESHC does/not/exist.mesh
