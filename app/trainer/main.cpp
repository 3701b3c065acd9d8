// trainer: the command-line entry point (placeholder while the modules are built).
int main() { return 0; }
