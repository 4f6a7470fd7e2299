namespace ztrain::optim {}
