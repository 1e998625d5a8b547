#include "tinyloop.h"
int main() { return 0; }
