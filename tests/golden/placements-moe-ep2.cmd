$MESHC --dump=placements --set mesh.dp=1 --set mesh.ep=2 --set train.global_batch=4 --set train.micro_batch=2 examples/moe.mesh
