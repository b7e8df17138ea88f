$MESHC --dump=placements --set mesh.dp=2 --set train.zero=1 --set train.bucket_size=20000 examples/gpt-tiny.mesh
