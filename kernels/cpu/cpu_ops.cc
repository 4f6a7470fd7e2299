namespace ztrain::kernels {}
