namespace ztrain::data {}
