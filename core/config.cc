#include "core/config.h"
namespace ztrain {}
