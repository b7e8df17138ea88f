$MESHC --dump=schedule --set mesh.dp=1 --set train.global_batch=8 --set train.micro_batch=2 examples/llama.mesh
