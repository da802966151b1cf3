/* tests/modules/fake_dep.c - a library one fake module needs and the test hides (fake_module.c). */
__attribute__((visibility("default"))) int fake_dep_value(void);
int fake_dep_value(void) { return 1; }
