$MESHC --dump=placements --set mesh.dp=2 examples/gpt-tiny.mesh
