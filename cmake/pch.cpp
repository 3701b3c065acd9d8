// Translation unit that owns the precompiled header (see CMakeLists.txt).
