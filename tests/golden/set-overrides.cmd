$MESHC --set mesh.tp=4 --set mesh.dp=1 --set train.micro_batch=8 --set model.layers=24 --set train.schedule=interleaved --set train.virtual_stages=3 examples/gpt2.mesh
