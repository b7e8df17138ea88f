$MESHC --dump=placements --set mesh.dp=1 --set mesh.pp=1 --set train.sequence_parallel=true examples/gpt2.mesh
