namespace ztrain {}
