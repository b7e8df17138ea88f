$MESHC --dump=schedule --set mesh.pp=2 --set train.global_batch=4 --set train.micro_batch=2 examples/gpt-tiny.mesh
