$MESHC --dump=placements --set train.recompute=full --set mesh.pp=1 --set mesh.dp=1 examples/gpt2.mesh
