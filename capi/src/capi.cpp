#include "tinyloop.h"
