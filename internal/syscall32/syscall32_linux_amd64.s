#include "textflag.h"

// func int80(trap, a1, a2, a3, a4, a5 uintptr) uintptr
TEXT ·int80(SB),NOSPLIT,$0-56
	MOVQ	trap+0(FP), AX
	MOVQ	a1+8(FP), BX
	MOVQ	a2+16(FP), CX
	MOVQ	a3+24(FP), DX
	MOVQ	a4+32(FP), SI
	MOVQ	a5+40(FP), DI
	INT	$0x80
	MOVQ	AX, ret+48(FP)
	RET
