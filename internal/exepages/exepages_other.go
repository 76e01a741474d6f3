//go:build !linux

package exepages

// Mappings lists nothing where the system does not show mappings.
func Mappings() ([]Region, error) { return nil, nil }

// Release does nothing where the system does not show mappings: the
// kernel reclaims clean file pages under pressure anyway.
func Release() (int64, error) { return 0, nil }
