//go:build !linux && !darwin

package proc

func identify(int) (Identity, error) { return Identity{}, ErrUnverifiable }
