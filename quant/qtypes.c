/* qtypes.c - the traits table of the int8 formats (docs/style.md §13.9): name,
 * group size, bytes per group and the reference row functions. */
#include "quant/quant.h"

#include <string.h>

#define W8(nm, g) {nm, g, SFW_QL_BITS, (g) ? (size_t)(g) + 2 : 0, sfw_quant_row_w8_ref, sfw_quant_dequant_row_w8}
static const struct sfw_qtype_traits traits[] = {
	W8("w8-g128", 128), W8("w8-g64", 64), W8("w8-g32", 32), W8("w8-channel", SFW_QL_GROUP_CHANNEL),
};

const struct sfw_qtype_traits *sfw_quant_traits(int group_size)
{
	for (size_t i = 0; i < sizeof(traits) / sizeof(traits[0]); i++)
		if (traits[i].group_size == group_size)
			return &traits[i];
	return NULL;
}

int sfw_quant_group_parse(const char *s)
{
	if (!s)
		return -1;
	if (strcmp(s, "channel") == 0)
		return SFW_QL_GROUP_CHANNEL;
	if (strcmp(s, "32") == 0)
		return 32;
	if (strcmp(s, "64") == 0)
		return 64;
	if (strcmp(s, "128") == 0)
		return 128;
	return -1;
}
