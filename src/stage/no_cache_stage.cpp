// NoCacheStage is header-only; this unit anchors the stage library.
#include "stage/stage_backend.h"
