$MESHC --dump=placements --set mesh.tp=1 --set mesh.dp=4 --set train.zero=3 examples/gpt-tiny.mesh
