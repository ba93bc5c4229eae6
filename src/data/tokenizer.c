#include "../core/input_file.h"
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- Unicode classes for the pre-tokeniser ------------------------------------------------
 * \p{L} and \p{N} as code point ranges, generated from Unicode 17 (Node 20, ICU 78) with:
 *   node -e 'for(c=0;c<0x110000;c++) /^\p{L}$/u.test(String.fromCodePoint(c)) ...'
 * (collect maximal runs of matching code points; same for \p{N}). */
static const uint32_t k_letter[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xAA, 0xAA}, {0xB5, 0xB5}, {0xBA, 0xBA}, {0xC0, 0xD6}, {0xD8, 0xF6},
    {0xF8, 0x2C1}, {0x2C6, 0x2D1}, {0x2E0, 0x2E4}, {0x2EC, 0x2EC}, {0x2EE, 0x2EE}, {0x370, 0x374},
    {0x376, 0x377}, {0x37A, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556}, {0x559, 0x559},
    {0x560, 0x588}, {0x5D0, 0x5EA}, {0x5EF, 0x5F2}, {0x620, 0x64A}, {0x66E, 0x66F}, {0x671, 0x6D3},
    {0x6D5, 0x6D5}, {0x6E5, 0x6E6}, {0x6EE, 0x6EF}, {0x6FA, 0x6FC}, {0x6FF, 0x6FF}, {0x710, 0x710},
    {0x712, 0x72F}, {0x74D, 0x7A5}, {0x7B1, 0x7B1}, {0x7CA, 0x7EA}, {0x7F4, 0x7F5}, {0x7FA, 0x7FA},
    {0x800, 0x815}, {0x81A, 0x81A}, {0x824, 0x824}, {0x828, 0x828}, {0x840, 0x858}, {0x860, 0x86A},
    {0x870, 0x887}, {0x889, 0x88F}, {0x8A0, 0x8C9}, {0x904, 0x939}, {0x93D, 0x93D}, {0x950, 0x950},
    {0x958, 0x961}, {0x971, 0x980}, {0x985, 0x98C}, {0x98F, 0x990}, {0x993, 0x9A8}, {0x9AA, 0x9B0},
    {0x9B2, 0x9B2}, {0x9B6, 0x9B9}, {0x9BD, 0x9BD}, {0x9CE, 0x9CE}, {0x9DC, 0x9DD}, {0x9DF, 0x9E1},
    {0x9F0, 0x9F1}, {0x9FC, 0x9FC}, {0xA05, 0xA0A}, {0xA0F, 0xA10}, {0xA13, 0xA28}, {0xA2A, 0xA30},
    {0xA32, 0xA33}, {0xA35, 0xA36}, {0xA38, 0xA39}, {0xA59, 0xA5C}, {0xA5E, 0xA5E}, {0xA72, 0xA74},
    {0xA85, 0xA8D}, {0xA8F, 0xA91}, {0xA93, 0xAA8}, {0xAAA, 0xAB0}, {0xAB2, 0xAB3}, {0xAB5, 0xAB9},
    {0xABD, 0xABD}, {0xAD0, 0xAD0}, {0xAE0, 0xAE1}, {0xAF9, 0xAF9}, {0xB05, 0xB0C}, {0xB0F, 0xB10},
    {0xB13, 0xB28}, {0xB2A, 0xB30}, {0xB32, 0xB33}, {0xB35, 0xB39}, {0xB3D, 0xB3D}, {0xB5C, 0xB5D},
    {0xB5F, 0xB61}, {0xB71, 0xB71}, {0xB83, 0xB83}, {0xB85, 0xB8A}, {0xB8E, 0xB90}, {0xB92, 0xB95},
    {0xB99, 0xB9A}, {0xB9C, 0xB9C}, {0xB9E, 0xB9F}, {0xBA3, 0xBA4}, {0xBA8, 0xBAA}, {0xBAE, 0xBB9},
    {0xBD0, 0xBD0}, {0xC05, 0xC0C}, {0xC0E, 0xC10}, {0xC12, 0xC28}, {0xC2A, 0xC39}, {0xC3D, 0xC3D},
    {0xC58, 0xC5A}, {0xC5C, 0xC5D}, {0xC60, 0xC61}, {0xC80, 0xC80}, {0xC85, 0xC8C}, {0xC8E, 0xC90},
    {0xC92, 0xCA8}, {0xCAA, 0xCB3}, {0xCB5, 0xCB9}, {0xCBD, 0xCBD}, {0xCDC, 0xCDE}, {0xCE0, 0xCE1},
    {0xCF1, 0xCF2}, {0xD04, 0xD0C}, {0xD0E, 0xD10}, {0xD12, 0xD3A}, {0xD3D, 0xD3D}, {0xD4E, 0xD4E},
    {0xD54, 0xD56}, {0xD5F, 0xD61}, {0xD7A, 0xD7F}, {0xD85, 0xD96}, {0xD9A, 0xDB1}, {0xDB3, 0xDBB},
    {0xDBD, 0xDBD}, {0xDC0, 0xDC6}, {0xE01, 0xE30}, {0xE32, 0xE33}, {0xE40, 0xE46}, {0xE81, 0xE82},
    {0xE84, 0xE84}, {0xE86, 0xE8A}, {0xE8C, 0xEA3}, {0xEA5, 0xEA5}, {0xEA7, 0xEB0}, {0xEB2, 0xEB3},
    {0xEBD, 0xEBD}, {0xEC0, 0xEC4}, {0xEC6, 0xEC6}, {0xEDC, 0xEDF}, {0xF00, 0xF00}, {0xF40, 0xF47},
    {0xF49, 0xF6C}, {0xF88, 0xF8C}, {0x1000, 0x102A}, {0x103F, 0x103F}, {0x1050, 0x1055}, {0x105A, 0x105D},
    {0x1061, 0x1061}, {0x1065, 0x1066}, {0x106E, 0x1070}, {0x1075, 0x1081}, {0x108E, 0x108E},
    {0x10A0, 0x10C5}, {0x10C7, 0x10C7}, {0x10CD, 0x10CD}, {0x10D0, 0x10FA}, {0x10FC, 0x1248},
    {0x124A, 0x124D}, {0x1250, 0x1256}, {0x1258, 0x1258}, {0x125A, 0x125D}, {0x1260, 0x1288},
    {0x128A, 0x128D}, {0x1290, 0x12B0}, {0x12B2, 0x12B5}, {0x12B8, 0x12BE}, {0x12C0, 0x12C0},
    {0x12C2, 0x12C5}, {0x12C8, 0x12D6}, {0x12D8, 0x1310}, {0x1312, 0x1315}, {0x1318, 0x135A},
    {0x1380, 0x138F}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1401, 0x166C}, {0x166F, 0x167F},
    {0x1681, 0x169A}, {0x16A0, 0x16EA}, {0x16F1, 0x16F8}, {0x1700, 0x1711}, {0x171F, 0x1731},
    {0x1740, 0x1751}, {0x1760, 0x176C}, {0x176E, 0x1770}, {0x1780, 0x17B3}, {0x17D7, 0x17D7},
    {0x17DC, 0x17DC}, {0x1820, 0x1878}, {0x1880, 0x1884}, {0x1887, 0x18A8}, {0x18AA, 0x18AA},
    {0x18B0, 0x18F5}, {0x1900, 0x191E}, {0x1950, 0x196D}, {0x1970, 0x1974}, {0x1980, 0x19AB},
    {0x19B0, 0x19C9}, {0x1A00, 0x1A16}, {0x1A20, 0x1A54}, {0x1AA7, 0x1AA7}, {0x1B05, 0x1B33},
    {0x1B45, 0x1B4C}, {0x1B83, 0x1BA0}, {0x1BAE, 0x1BAF}, {0x1BBA, 0x1BE5}, {0x1C00, 0x1C23},
    {0x1C4D, 0x1C4F}, {0x1C5A, 0x1C7D}, {0x1C80, 0x1C8A}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1CE9, 0x1CEC}, {0x1CEE, 0x1CF3}, {0x1CF5, 0x1CF6}, {0x1CFA, 0x1CFA}, {0x1D00, 0x1DBF},
    {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57},
    {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4},
    {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2071, 0x2071},
    {0x207F, 0x207F}, {0x2090, 0x209C}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E},
    {0x2183, 0x2184}, {0x2C00, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0x2D00, 0x2D25},
    {0x2D27, 0x2D27}, {0x2D2D, 0x2D2D}, {0x2D30, 0x2D67}, {0x2D6F, 0x2D6F}, {0x2D80, 0x2D96},
    {0x2DA0, 0x2DA6}, {0x2DA8, 0x2DAE}, {0x2DB0, 0x2DB6}, {0x2DB8, 0x2DBE}, {0x2DC0, 0x2DC6},
    {0x2DC8, 0x2DCE}, {0x2DD0, 0x2DD6}, {0x2DD8, 0x2DDE}, {0x2E2F, 0x2E2F}, {0x3005, 0x3006},
    {0x3031, 0x3035}, {0x303B, 0x303C}, {0x3041, 0x3096}, {0x309D, 0x309F}, {0x30A1, 0x30FA},
    {0x30FC, 0x30FF}, {0x3105, 0x312F}, {0x3131, 0x318E}, {0x31A0, 0x31BF}, {0x31F0, 0x31FF},
    {0x3400, 0x4DBF}, {0x4E00, 0xA48C}, {0xA4D0, 0xA4FD}, {0xA500, 0xA60C}, {0xA610, 0xA61F},
    {0xA62A, 0xA62B}, {0xA640, 0xA66E}, {0xA67F, 0xA69D}, {0xA6A0, 0xA6E5}, {0xA717, 0xA71F},
    {0xA722, 0xA788}, {0xA78B, 0xA7DC}, {0xA7F1, 0xA801}, {0xA803, 0xA805}, {0xA807, 0xA80A},
    {0xA80C, 0xA822}, {0xA840, 0xA873}, {0xA882, 0xA8B3}, {0xA8F2, 0xA8F7}, {0xA8FB, 0xA8FB},
    {0xA8FD, 0xA8FE}, {0xA90A, 0xA925}, {0xA930, 0xA946}, {0xA960, 0xA97C}, {0xA984, 0xA9B2},
    {0xA9CF, 0xA9CF}, {0xA9E0, 0xA9E4}, {0xA9E6, 0xA9EF}, {0xA9FA, 0xA9FE}, {0xAA00, 0xAA28},
    {0xAA40, 0xAA42}, {0xAA44, 0xAA4B}, {0xAA60, 0xAA76}, {0xAA7A, 0xAA7A}, {0xAA7E, 0xAAAF},
    {0xAAB1, 0xAAB1}, {0xAAB5, 0xAAB6}, {0xAAB9, 0xAABD}, {0xAAC0, 0xAAC0}, {0xAAC2, 0xAAC2},
    {0xAADB, 0xAADD}, {0xAAE0, 0xAAEA}, {0xAAF2, 0xAAF4}, {0xAB01, 0xAB06}, {0xAB09, 0xAB0E},
    {0xAB11, 0xAB16}, {0xAB20, 0xAB26}, {0xAB28, 0xAB2E}, {0xAB30, 0xAB5A}, {0xAB5C, 0xAB69},
    {0xAB70, 0xABE2}, {0xAC00, 0xD7A3}, {0xD7B0, 0xD7C6}, {0xD7CB, 0xD7FB}, {0xF900, 0xFA6D},
    {0xFA70, 0xFAD9}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFB1D, 0xFB1D}, {0xFB1F, 0xFB28},
    {0xFB2A, 0xFB36}, {0xFB38, 0xFB3C}, {0xFB3E, 0xFB3E}, {0xFB40, 0xFB41}, {0xFB43, 0xFB44},
    {0xFB46, 0xFBB1}, {0xFBD3, 0xFD3D}, {0xFD50, 0xFD8F}, {0xFD92, 0xFDC7}, {0xFDF0, 0xFDFB},
    {0xFE70, 0xFE74}, {0xFE76, 0xFEFC}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE},
    {0xFFC2, 0xFFC7}, {0xFFCA, 0xFFCF}, {0xFFD2, 0xFFD7}, {0xFFDA, 0xFFDC}, {0x10000, 0x1000B},
    {0x1000D, 0x10026}, {0x10028, 0x1003A}, {0x1003C, 0x1003D}, {0x1003F, 0x1004D}, {0x10050, 0x1005D},
    {0x10080, 0x100FA}, {0x10280, 0x1029C}, {0x102A0, 0x102D0}, {0x10300, 0x1031F}, {0x1032D, 0x10340},
    {0x10342, 0x10349}, {0x10350, 0x10375}, {0x10380, 0x1039D}, {0x103A0, 0x103C3}, {0x103C8, 0x103CF},
    {0x10400, 0x1049D}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10500, 0x10527}, {0x10530, 0x10563},
    {0x10570, 0x1057A}, {0x1057C, 0x1058A}, {0x1058C, 0x10592}, {0x10594, 0x10595}, {0x10597, 0x105A1},
    {0x105A3, 0x105B1}, {0x105B3, 0x105B9}, {0x105BB, 0x105BC}, {0x105C0, 0x105F3}, {0x10600, 0x10736},
    {0x10740, 0x10755}, {0x10760, 0x10767}, {0x10780, 0x10785}, {0x10787, 0x107B0}, {0x107B2, 0x107BA},
    {0x10800, 0x10805}, {0x10808, 0x10808}, {0x1080A, 0x10835}, {0x10837, 0x10838}, {0x1083C, 0x1083C},
    {0x1083F, 0x10855}, {0x10860, 0x10876}, {0x10880, 0x1089E}, {0x108E0, 0x108F2}, {0x108F4, 0x108F5},
    {0x10900, 0x10915}, {0x10920, 0x10939}, {0x10940, 0x10959}, {0x10980, 0x109B7}, {0x109BE, 0x109BF},
    {0x10A00, 0x10A00}, {0x10A10, 0x10A13}, {0x10A15, 0x10A17}, {0x10A19, 0x10A35}, {0x10A60, 0x10A7C},
    {0x10A80, 0x10A9C}, {0x10AC0, 0x10AC7}, {0x10AC9, 0x10AE4}, {0x10B00, 0x10B35}, {0x10B40, 0x10B55},
    {0x10B60, 0x10B72}, {0x10B80, 0x10B91}, {0x10C00, 0x10C48}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2},
    {0x10D00, 0x10D23}, {0x10D4A, 0x10D65}, {0x10D6F, 0x10D85}, {0x10E80, 0x10EA9}, {0x10EB0, 0x10EB1},
    {0x10EC2, 0x10EC7}, {0x10F00, 0x10F1C}, {0x10F27, 0x10F27}, {0x10F30, 0x10F45}, {0x10F70, 0x10F81},
    {0x10FB0, 0x10FC4}, {0x10FE0, 0x10FF6}, {0x11003, 0x11037}, {0x11071, 0x11072}, {0x11075, 0x11075},
    {0x11083, 0x110AF}, {0x110D0, 0x110E8}, {0x11103, 0x11126}, {0x11144, 0x11144}, {0x11147, 0x11147},
    {0x11150, 0x11172}, {0x11176, 0x11176}, {0x11183, 0x111B2}, {0x111C1, 0x111C4}, {0x111DA, 0x111DA},
    {0x111DC, 0x111DC}, {0x11200, 0x11211}, {0x11213, 0x1122B}, {0x1123F, 0x11240}, {0x11280, 0x11286},
    {0x11288, 0x11288}, {0x1128A, 0x1128D}, {0x1128F, 0x1129D}, {0x1129F, 0x112A8}, {0x112B0, 0x112DE},
    {0x11305, 0x1130C}, {0x1130F, 0x11310}, {0x11313, 0x11328}, {0x1132A, 0x11330}, {0x11332, 0x11333},
    {0x11335, 0x11339}, {0x1133D, 0x1133D}, {0x11350, 0x11350}, {0x1135D, 0x11361}, {0x11380, 0x11389},
    {0x1138B, 0x1138B}, {0x1138E, 0x1138E}, {0x11390, 0x113B5}, {0x113B7, 0x113B7}, {0x113D1, 0x113D1},
    {0x113D3, 0x113D3}, {0x11400, 0x11434}, {0x11447, 0x1144A}, {0x1145F, 0x11461}, {0x11480, 0x114AF},
    {0x114C4, 0x114C5}, {0x114C7, 0x114C7}, {0x11580, 0x115AE}, {0x115D8, 0x115DB}, {0x11600, 0x1162F},
    {0x11644, 0x11644}, {0x11680, 0x116AA}, {0x116B8, 0x116B8}, {0x11700, 0x1171A}, {0x11740, 0x11746},
    {0x11800, 0x1182B}, {0x118A0, 0x118DF}, {0x118FF, 0x11906}, {0x11909, 0x11909}, {0x1190C, 0x11913},
    {0x11915, 0x11916}, {0x11918, 0x1192F}, {0x1193F, 0x1193F}, {0x11941, 0x11941}, {0x119A0, 0x119A7},
    {0x119AA, 0x119D0}, {0x119E1, 0x119E1}, {0x119E3, 0x119E3}, {0x11A00, 0x11A00}, {0x11A0B, 0x11A32},
    {0x11A3A, 0x11A3A}, {0x11A50, 0x11A50}, {0x11A5C, 0x11A89}, {0x11A9D, 0x11A9D}, {0x11AB0, 0x11AF8},
    {0x11BC0, 0x11BE0}, {0x11C00, 0x11C08}, {0x11C0A, 0x11C2E}, {0x11C40, 0x11C40}, {0x11C72, 0x11C8F},
    {0x11D00, 0x11D06}, {0x11D08, 0x11D09}, {0x11D0B, 0x11D30}, {0x11D46, 0x11D46}, {0x11D60, 0x11D65},
    {0x11D67, 0x11D68}, {0x11D6A, 0x11D89}, {0x11D98, 0x11D98}, {0x11DB0, 0x11DDB}, {0x11EE0, 0x11EF2},
    {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x11FB0, 0x11FB0}, {0x12000, 0x12399},
    {0x12480, 0x12543}, {0x12F90, 0x12FF0}, {0x13000, 0x1342F}, {0x13441, 0x13446}, {0x13460, 0x143FA},
    {0x14400, 0x14646}, {0x16100, 0x1611D}, {0x16800, 0x16A38}, {0x16A40, 0x16A5E}, {0x16A70, 0x16ABE},
    {0x16AD0, 0x16AED}, {0x16B00, 0x16B2F}, {0x16B40, 0x16B43}, {0x16B63, 0x16B77}, {0x16B7D, 0x16B8F},
    {0x16D40, 0x16D6C}, {0x16E40, 0x16E7F}, {0x16EA0, 0x16EB8}, {0x16EBB, 0x16ED3}, {0x16F00, 0x16F4A},
    {0x16F50, 0x16F50}, {0x16F93, 0x16F9F}, {0x16FE0, 0x16FE1}, {0x16FE3, 0x16FE3}, {0x16FF2, 0x16FF3},
    {0x17000, 0x18CD5}, {0x18CFF, 0x18D1E}, {0x18D80, 0x18DF2}, {0x1AFF0, 0x1AFF3}, {0x1AFF5, 0x1AFFB},
    {0x1AFFD, 0x1AFFE}, {0x1B000, 0x1B122}, {0x1B132, 0x1B132}, {0x1B150, 0x1B152}, {0x1B155, 0x1B155},
    {0x1B164, 0x1B167}, {0x1B170, 0x1B2FB}, {0x1BC00, 0x1BC6A}, {0x1BC70, 0x1BC7C}, {0x1BC80, 0x1BC88},
    {0x1BC90, 0x1BC99}, {0x1D400, 0x1D454}, {0x1D456, 0x1D49C}, {0x1D49E, 0x1D49F}, {0x1D4A2, 0x1D4A2},
    {0x1D4A5, 0x1D4A6}, {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB}, {0x1D4BD, 0x1D4C3},
    {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514}, {0x1D516, 0x1D51C}, {0x1D51E, 0x1D539},
    {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544}, {0x1D546, 0x1D546}, {0x1D54A, 0x1D550}, {0x1D552, 0x1D6A5},
    {0x1D6A8, 0x1D6C0}, {0x1D6C2, 0x1D6DA}, {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714}, {0x1D716, 0x1D734},
    {0x1D736, 0x1D74E}, {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8}, {0x1D7AA, 0x1D7C2},
    {0x1D7C4, 0x1D7CB}, {0x1DF00, 0x1DF1E}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D}, {0x1E100, 0x1E12C},
    {0x1E137, 0x1E13D}, {0x1E14E, 0x1E14E}, {0x1E290, 0x1E2AD}, {0x1E2C0, 0x1E2EB}, {0x1E4D0, 0x1E4EB},
    {0x1E5D0, 0x1E5ED}, {0x1E5F0, 0x1E5F0}, {0x1E6C0, 0x1E6DE}, {0x1E6E0, 0x1E6E2}, {0x1E6E4, 0x1E6E5},
    {0x1E6E7, 0x1E6ED}, {0x1E6F0, 0x1E6F4}, {0x1E6FE, 0x1E6FF}, {0x1E7E0, 0x1E7E6}, {0x1E7E8, 0x1E7EB},
    {0x1E7ED, 0x1E7EE}, {0x1E7F0, 0x1E7FE}, {0x1E800, 0x1E8C4}, {0x1E900, 0x1E943}, {0x1E94B, 0x1E94B},
    {0x1EE00, 0x1EE03}, {0x1EE05, 0x1EE1F}, {0x1EE21, 0x1EE22}, {0x1EE24, 0x1EE24}, {0x1EE27, 0x1EE27},
    {0x1EE29, 0x1EE32}, {0x1EE34, 0x1EE37}, {0x1EE39, 0x1EE39}, {0x1EE3B, 0x1EE3B}, {0x1EE42, 0x1EE42},
    {0x1EE47, 0x1EE47}, {0x1EE49, 0x1EE49}, {0x1EE4B, 0x1EE4B}, {0x1EE4D, 0x1EE4F}, {0x1EE51, 0x1EE52},
    {0x1EE54, 0x1EE54}, {0x1EE57, 0x1EE57}, {0x1EE59, 0x1EE59}, {0x1EE5B, 0x1EE5B}, {0x1EE5D, 0x1EE5D},
    {0x1EE5F, 0x1EE5F}, {0x1EE61, 0x1EE62}, {0x1EE64, 0x1EE64}, {0x1EE67, 0x1EE6A}, {0x1EE6C, 0x1EE72},
    {0x1EE74, 0x1EE77}, {0x1EE79, 0x1EE7C}, {0x1EE7E, 0x1EE7E}, {0x1EE80, 0x1EE89}, {0x1EE8B, 0x1EE9B},
    {0x1EEA1, 0x1EEA3}, {0x1EEA5, 0x1EEA9}, {0x1EEAB, 0x1EEBB}, {0x20000, 0x2A6DF}, {0x2A700, 0x2B81D},
    {0x2B820, 0x2CEAD}, {0x2CEB0, 0x2EBE0}, {0x2EBF0, 0x2EE5D}, {0x2F800, 0x2FA1D}, {0x30000, 0x3134A},
    {0x31350, 0x33479},
};
static const uint32_t k_number[][2] = {
    {0x30, 0x39}, {0xB2, 0xB3}, {0xB9, 0xB9}, {0xBC, 0xBE}, {0x660, 0x669}, {0x6F0, 0x6F9}, {0x7C0, 0x7C9},
    {0x966, 0x96F}, {0x9E6, 0x9EF}, {0x9F4, 0x9F9}, {0xA66, 0xA6F}, {0xAE6, 0xAEF}, {0xB66, 0xB6F},
    {0xB72, 0xB77}, {0xBE6, 0xBF2}, {0xC66, 0xC6F}, {0xC78, 0xC7E}, {0xCE6, 0xCEF}, {0xD58, 0xD5E},
    {0xD66, 0xD78}, {0xDE6, 0xDEF}, {0xE50, 0xE59}, {0xED0, 0xED9}, {0xF20, 0xF33}, {0x1040, 0x1049},
    {0x1090, 0x1099}, {0x1369, 0x137C}, {0x16EE, 0x16F0}, {0x17E0, 0x17E9}, {0x17F0, 0x17F9},
    {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A89}, {0x1A90, 0x1A99},
    {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0x2070, 0x2070},
    {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B},
    {0x24EA, 0x24FF}, {0x2776, 0x2793}, {0x2CFD, 0x2CFD}, {0x3007, 0x3007}, {0x3021, 0x3029},
    {0x3038, 0x303A}, {0x3192, 0x3195}, {0x3220, 0x3229}, {0x3248, 0x324F}, {0x3251, 0x325F},
    {0x3280, 0x3289}, {0x32B1, 0x32BF}, {0xA620, 0xA629}, {0xA6E6, 0xA6EF}, {0xA830, 0xA835},
    {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9}, {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59},
    {0xABF0, 0xABF9}, {0xFF10, 0xFF19}, {0x10107, 0x10133}, {0x10140, 0x10178}, {0x1018A, 0x1018B},
    {0x102E1, 0x102FB}, {0x10320, 0x10323}, {0x10341, 0x10341}, {0x1034A, 0x1034A}, {0x103D1, 0x103D5},
    {0x104A0, 0x104A9}, {0x10858, 0x1085F}, {0x10879, 0x1087F}, {0x108A7, 0x108AF}, {0x108FB, 0x108FF},
    {0x10916, 0x1091B}, {0x109BC, 0x109BD}, {0x109C0, 0x109CF}, {0x109D2, 0x109FF}, {0x10A40, 0x10A48},
    {0x10A7D, 0x10A7E}, {0x10A9D, 0x10A9F}, {0x10AEB, 0x10AEF}, {0x10B58, 0x10B5F}, {0x10B78, 0x10B7F},
    {0x10BA9, 0x10BAF}, {0x10CFA, 0x10CFF}, {0x10D30, 0x10D39}, {0x10D40, 0x10D49}, {0x10E60, 0x10E7E},
    {0x10F1D, 0x10F26}, {0x10F51, 0x10F54}, {0x10FC5, 0x10FCB}, {0x11052, 0x1106F}, {0x110F0, 0x110F9},
    {0x11136, 0x1113F}, {0x111D0, 0x111D9}, {0x111E1, 0x111F4}, {0x112F0, 0x112F9}, {0x11450, 0x11459},
    {0x114D0, 0x114D9}, {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x116D0, 0x116E3}, {0x11730, 0x1173B},
    {0x118E0, 0x118F2}, {0x11950, 0x11959}, {0x11BF0, 0x11BF9}, {0x11C50, 0x11C6C}, {0x11D50, 0x11D59},
    {0x11DA0, 0x11DA9}, {0x11DE0, 0x11DE9}, {0x11F50, 0x11F59}, {0x11FC0, 0x11FD4}, {0x12400, 0x1246E},
    {0x16130, 0x16139}, {0x16A60, 0x16A69}, {0x16AC0, 0x16AC9}, {0x16B50, 0x16B59}, {0x16B5B, 0x16B61},
    {0x16D70, 0x16D79}, {0x16E80, 0x16E96}, {0x16FF4, 0x16FF6}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3},
    {0x1D2E0, 0x1D2F3}, {0x1D360, 0x1D378}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9},
    {0x1E4F0, 0x1E4F9}, {0x1E5F1, 0x1E5FA}, {0x1E8C7, 0x1E8CF}, {0x1E950, 0x1E959}, {0x1EC71, 0x1ECAB},
    {0x1ECAD, 0x1ECAF}, {0x1ECB1, 0x1ECB4}, {0x1ED01, 0x1ED2D}, {0x1ED2F, 0x1ED3D}, {0x1F100, 0x1F10C},
    {0x1FBF0, 0x1FBF9},
};

enum { C_OTHER, C_LETTER, C_NUMBER, C_SPACE };
#define CP_INVALID 0x110000u /* a byte that is not valid UTF-8: classed as other */

static int in_ranges(const uint32_t (*r)[2], size_t n, uint32_t cp) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid][0]) hi = mid;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* ECMAScript \s (the JS reference); Python's regex adds U+0085 and drops U+FEFF. */
static int is_space(uint32_t cp) {
    if (cp < 0x80) return cp == ' ' || (cp >= 9 && cp <= 13);
    return cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

static int cp_class(uint32_t cp) {
    if (cp < 0x80) {
        if ((cp | 32) >= 'a' && (cp | 32) <= 'z') return C_LETTER;
        if (cp >= '0' && cp <= '9') return C_NUMBER;
        return is_space(cp) ? C_SPACE : C_OTHER;
    }
    if (is_space(cp)) return C_SPACE;
    if (in_ranges(k_letter, sizeof k_letter / sizeof k_letter[0], cp)) return C_LETTER;
    if (in_ranges(k_number, sizeof k_number / sizeof k_number[0], cp)) return C_NUMBER;
    return C_OTHER;
}

/* One code point at s[i] (i < n) and its width; invalid/overlong/truncated sequences and
 * surrogates give CP_INVALID with width 1, so every byte is consumed exactly once. */
static uint32_t utf8_at(const unsigned char *s, size_t n, size_t i, size_t *w) {
    unsigned c = s[i];
    size_t need;
    uint32_t cp, min;
    *w = 1;
    if (c < 0x80) return c;
    if (c >= 0xC2 && c <= 0xDF) need = 1, cp = c & 0x1F, min = 0x80;
    else if (c >= 0xE0 && c <= 0xEF) need = 2, cp = c & 0x0F, min = 0x800;
    else if (c >= 0xF0 && c <= 0xF4) need = 3, cp = c & 0x07, min = 0x10000;
    else return CP_INVALID;
    if (n - i <= need) return CP_INVALID;
    for (size_t k = 1; k <= need; k++) {
        unsigned d = s[i + k];
        if ((d & 0xC0) != 0x80) return CP_INVALID;
        cp = cp << 6 | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return CP_INVALID;
    *w = need + 1;
    return cp;
}

/* ---- tokenizer ------------------------------------------------------------------------- */

struct dt_tokenizer {
    int bpe; /* 0: one token per byte */
    int vocab, eot;
    uint32_t *off;        /* token i is bytes[off[i] .. off[i+1]) */
    unsigned char *bytes;
    uint16_t byte_id[256]; /* token of each single byte */
    /* merges (a, b) -> (rank, merged id): open addressing, key ((a << 16) | b) + 1, 0 = empty */
    uint64_t *mkey;
    uint32_t *mrank;
    uint16_t *mout;
    size_t mmask;
};

static size_t hash64(uint64_t k) {
    k *= 0x9E3779B97F4A7C15ull;
    return (size_t)(k ^ (k >> 31));
}

static int merge_find(const dt_tokenizer *t, unsigned a, unsigned b, uint32_t *rank, uint16_t *out) {
    uint64_t key = (((uint64_t)a << 16) | b) + 1;
    for (size_t h = hash64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        if (t->mkey[h] == key) {
            *rank = t->mrank[h];
            *out = t->mout[h];
            return 1;
        }
        if (t->mkey[h] == 0) return 0;
    }
}

/* Later duplicates overwrite the rank, as dict(zip(merges, range(n))) does in the reference. */
static void merge_put(dt_tokenizer *t, unsigned a, unsigned b, uint32_t rank, uint16_t out) {
    uint64_t key = (((uint64_t)a << 16) | b) + 1;
    size_t h = hash64(key) & t->mmask;
    while (t->mkey[h] != 0 && t->mkey[h] != key) h = (h + 1) & t->mmask;
    t->mkey[h] = key;
    t->mrank[h] = rank;
    t->mout[h] = out;
}

void dt_tokenizer_free(dt_tokenizer *t) {
    if (!t) return;
    free(t->off);
    free(t->bytes);
    free(t->mkey);
    free(t->mrank);
    free(t->mout);
    free(t);
}

dt_status dt_tokenizer_byte(dt_tokenizer **out) {
    *out = NULL;
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dt_fail(DT_ERUNTIME, "out of memory creating byte tokenizer");
    t->vocab = 256;
    t->eot = -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = (uint16_t)b;
    *out = t;
    return DT_OK;
}

int dt_tokenizer_vocab(const dt_tokenizer *t) { return t->vocab; }
int dt_tokenizer_eot(const dt_tokenizer *t) { return t->eot; }
const char *dt_tokenizer_name(const dt_tokenizer *t) { return t->bpe ? "gpt2" : "byte"; }

/* ---- loading GPT-2 files ----------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68
 * bytes for U+0100.. in byte order. unichar_byte is the inverse (-1: not in the alphabet). */
static void byte_alphabet(int16_t unichar_byte[324]) {
    for (int c = 0; c < 324; c++) unichar_byte[c] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        unichar_byte[printable ? b : 256 + n++] = (int16_t)b;
    }
}

/* Maps a token string (UTF-8 of alphabet characters) to its bytes; dst may be NULL to count.
 * Returns the byte count, or -1 if a character is outside the alphabet. */
static long unichars_to_bytes(const int16_t *unichar_byte, const char *s, size_t n, unsigned char *dst) {
    size_t i = 0;
    long k = 0;
    while (i < n) {
        size_t w;
        uint32_t cp = utf8_at((const unsigned char *)s, n, i, &w);
        if (cp >= 324 || unichar_byte[cp] < 0) return -1;
        if (dst) dst[k] = (unsigned char)unichar_byte[cp];
        k++;
        i += w;
    }
    return k;
}

/* Byte string -> token id, used only while loading (merges name tokens by string). */
typedef struct {
    int32_t *slot;
    size_t mask;
} strmap;

static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static int strmap_find(const strmap *m, const dt_tokenizer *t, const unsigned char *p, size_t n) {
    for (size_t h = hash64(hash_bytes(p, n)) & m->mask;; h = (h + 1) & m->mask) {
        int32_t id = m->slot[h];
        if (id < 0) return -1;
        if (t->off[id + 1] - t->off[id] == n && memcmp(t->bytes + t->off[id], p, n) == 0) return id;
    }
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

static dt_status load_encoder(dt_tokenizer *t, strmap *map, const char *path, const int16_t *unichar_byte) {
    char *text;
    size_t len;
    DT_TRY(dt_input_read(path, "data.encoder_json", &text, &len, (size_t)1 << 30));
    dt_status st = DT_OK;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dt_fail(DT_EINPUT, "%s: malformed JSON (expected an object mapping token strings to ids)", path);
    }
    int n = cJSON_GetArraySize(root);
    if (n < 256 || n > 65536) {
        cJSON_Delete(root);
        return dt_fail(DT_EINPUT, "%s: %d tokens, expected 256..65536", path, n);
    }
    t->vocab = n;
    t->off = calloc((size_t)n + 1, sizeof *t->off);
    uint32_t *tlen = calloc((size_t)n, sizeof *tlen);
    char *seen = calloc((size_t)n, 1);
    if (!t->off || !tlen || !seen) {
        st = dt_fail(DT_ERUNTIME, "%s: out of memory", path);
        goto done;
    }
    /* Pass 1: validate ids (dense 0..n-1, each once) and measure token lengths. */
    const cJSON *e;
    size_t total = 0;
    cJSON_ArrayForEach(e, root) {
        double v = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!e->string || v < 0 || v >= n || v != (double)(int)v) {
            st = dt_fail(DT_EINPUT, "%s: entry \"%.40s\": id must be an integer in 0..%d", path,
                         e->string ? e->string : "", n - 1);
            goto done;
        }
        int id = (int)v;
        if (seen[id]) {
            st = dt_fail(DT_EINPUT, "%s: id %d used twice", path, id);
            goto done;
        }
        seen[id] = 1;
        long k = unichars_to_bytes(unichar_byte, e->string, strlen(e->string), NULL);
        if (k <= 0) {
            st = dt_fail(DT_EINPUT, "%s: token \"%.40s\" is empty or not in GPT-2's byte alphabet", path, e->string);
            goto done;
        }
        tlen[id] = (uint32_t)k;
        total += (size_t)k;
    }
    for (int i = 0; i < n; i++) t->off[i + 1] = t->off[i] + tlen[i];
    t->bytes = malloc(total ? total : 1);
    map->mask = pow2_at_least((size_t)n * 2) - 1;
    map->slot = malloc((map->mask + 1) * sizeof *map->slot);
    if (!t->bytes || !map->slot) {
        st = dt_fail(DT_ERUNTIME, "%s: out of memory", path);
        goto done;
    }
    memset(map->slot, 0xff, (map->mask + 1) * sizeof *map->slot);
    /* Pass 2: token bytes, and the string -> id map (token strings must be distinct). */
    cJSON_ArrayForEach(e, root) {
        int id = (int)e->valuedouble;
        unsigned char *p = t->bytes + t->off[id];
        unichars_to_bytes(unichar_byte, e->string, strlen(e->string), p);
        if (strmap_find(map, t, p, tlen[id]) >= 0) {
            st = dt_fail(DT_EINPUT, "%s: token \"%.40s\" appears twice", path, e->string);
            goto done;
        }
        size_t h = hash64(hash_bytes(p, tlen[id])) & map->mask;
        while (map->slot[h] >= 0) h = (h + 1) & map->mask;
        map->slot[h] = id;
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        int id = strmap_find(map, t, &c, 1);
        if (id < 0) {
            st = dt_fail(DT_EINPUT, "%s: no token for byte 0x%02x", path, b);
            goto done;
        }
        t->byte_id[b] = (uint16_t)id;
    }
    t->eot = strmap_find(map, t, (const unsigned char *)"<|endoftext|>", 13);
done:
    free(tlen);
    free(seen);
    cJSON_Delete(root);
    return st;
}

/* vocab.bpe: "#version" line, then one merge "A B" per line, ranked by line order. */
static dt_status load_merges(dt_tokenizer *t, const strmap *map, const char *path, const int16_t *unichar_byte) {
    char *text;
    size_t len;
    DT_TRY(dt_input_read(path, "data.vocab_bpe", &text, &len, (size_t)1 << 30));
    dt_status st = DT_OK;
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    t->mmask = pow2_at_least(lines * 2) - 1;
    t->mkey = calloc(t->mmask + 1, sizeof *t->mkey);
    t->mrank = malloc((t->mmask + 1) * sizeof *t->mrank);
    t->mout = malloc((t->mmask + 1) * sizeof *t->mout);
    unsigned char *tmp = malloc(len + 1);
    if (!t->mkey || !t->mrank || !t->mout || !tmp) {
        st = dt_fail(DT_ERUNTIME, "%s: out of memory", path);
        goto done;
    }
    uint32_t rank = 0;
    size_t lineno = 0;
    for (char *line = text; line < text + len;) {
        char *nl = memchr(line, '\n', (size_t)(text + len - line));
        char *end = nl ? nl : text + len;
        char *next = nl ? nl + 1 : text + len;
        lineno++;
        if (end > line && end[-1] == '\r') end--;
        size_t n = (size_t)(end - line);
        if (n == 0 || (lineno == 1 && n >= 8 && memcmp(line, "#version", 8) == 0)) {
            line = next;
            continue;
        }
        char *sp = memchr(line, ' ', n);
        size_t na = sp ? (size_t)(sp - line) : 0, nb = sp ? n - na - 1 : 0;
        if (!sp || na == 0 || nb == 0 || memchr(sp + 1, ' ', nb)) {
            st = dt_fail(DT_EINPUT, "%s:%zu: bad merges line \"%.*s\" (expected two symbols)", path, lineno,
                         (int)(n < 60 ? n : 60), line);
            goto done;
        }
        long ka = unichars_to_bytes(unichar_byte, line, na, tmp);
        long kb = ka < 0 ? -1 : unichars_to_bytes(unichar_byte, sp + 1, nb, tmp + ka);
        int a = ka > 0 ? strmap_find(map, t, tmp, (size_t)ka) : -1;
        int b = kb > 0 ? strmap_find(map, t, tmp + ka, (size_t)kb) : -1;
        int ab = a >= 0 && b >= 0 ? strmap_find(map, t, tmp, (size_t)(ka + kb)) : -1;
        if (ab < 0) {
            st = dt_fail(DT_EINPUT, "%s:%zu: bad merges line \"%.*s\" (%s not in the encoder)", path, lineno,
                         (int)(n < 60 ? n : 60), line,
                         a < 0 ? "first symbol" : b < 0 ? "second symbol" : "merged token");
            goto done;
        }
        merge_put(t, (unsigned)a, (unsigned)b, rank++, (uint16_t)ab);
        line = next;
    }
done:
    free(tmp);
    free(text);
    return st;
}

dt_status dt_tokenizer_gpt2(dt_tokenizer **out, const char *encoder_json, const char *vocab_bpe) {
    *out = NULL;
    dt_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dt_fail(DT_ERUNTIME, "out of memory creating GPT-2 tokenizer");
    t->bpe = 1;
    int16_t unichar_byte[324];
    byte_alphabet(unichar_byte);
    strmap map = {0};
    dt_status st = load_encoder(t, &map, encoder_json, unichar_byte);
    if (st == DT_OK) st = load_merges(t, &map, vocab_bpe, unichar_byte);
    free(map.slot);
    if (st != DT_OK) {
        dt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return DT_OK;
}

/* ---- encoding ----------------------------------------------------------------------------- */

typedef struct {
    uint32_t rank;
    int32_t pos; /* left symbol of the pair */
    uint16_t a, b, out;
} pair_ent;

/* Per-call working memory for bpe(), grown to the longest pre-token seen. */
typedef struct {
    uint16_t *id;
    int32_t *prev, *next, *list;
    size_t cap;
    pair_ent *heap;
    size_t hn, hcap;
} scratch;

static void scratch_free(scratch *s) {
    free(s->id);
    free(s->prev);
    free(s->next);
    free(s->list);
    free(s->heap);
}

static dt_status scratch_reserve(scratch *s, size_t m) {
    if (m <= s->cap) return DT_OK;
    if (m > (size_t)INT32_MAX / 2) return dt_fail(DT_EINPUT, "tokenizer: a single word of %zu bytes is too long", m);
    size_t c = pow2_at_least(m);
    uint16_t *id = realloc(s->id, c * sizeof *id);
    if (id) s->id = id;
    int32_t *prev = realloc(s->prev, c * sizeof *prev);
    if (prev) s->prev = prev;
    int32_t *next = realloc(s->next, c * sizeof *next);
    if (next) s->next = next;
    int32_t *list = realloc(s->list, 2 * c * sizeof *list); /* a position can be queued twice */
    if (list) s->list = list;
    if (!id || !prev || !next || !list) return dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
    s->cap = c;
    return DT_OK;
}

static dt_status heap_push(scratch *s, pair_ent e) {
    if (s->hn == s->hcap) {
        size_t c = s->hcap ? s->hcap * 2 : 256;
        pair_ent *h = realloc(s->heap, c * sizeof *h);
        if (!h) return dt_fail(DT_ERUNTIME, "tokenizer: out of memory");
        s->heap = h;
        s->hcap = c;
    }
    size_t i = s->hn++;
    while (i > 0 && s->heap[(i - 1) / 2].rank > e.rank) {
        s->heap[i] = s->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->heap[i] = e;
    return DT_OK;
}

static pair_ent heap_pop(scratch *s) {
    pair_ent top = s->heap[0], last = s->heap[--s->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->hn) break;
        if (c + 1 < s->hn && s->heap[c + 1].rank < s->heap[c].rank) c++;
        if (s->heap[c].rank >= last.rank) break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->hn) s->heap[i] = last;
    return top;
}

/* Queues the pair whose left symbol is i, if it is a known merge. */
static dt_status push_pair(const dt_tokenizer *t, scratch *s, int32_t i) {
    int32_t j = s->next[i];
    pair_ent e = {0, i, s->id[i], s->id[j], 0};
    if (!merge_find(t, e.a, e.b, &e.rank, &e.out)) return DT_OK;
    return heap_push(s, e);
}

static int pair_live(const scratch *s, const pair_ent *e) {
    int32_t j = s->next[e->pos]; /* -1: last symbol, -2: merged away */
    return j >= 0 && s->id[e->pos] == e->a && s->id[j] == e->b;
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return (a > b) - (a < b);
}

/* The reference bpe(): while some adjacent pair is a merge, take the lowest-ranked one and
 * merge all its occurrences left to right. A min-heap of live pairs makes this O(m log m);
 * a merge never creates another pair of the same rank, so one rank is one batch. */
static dt_status bpe(const dt_tokenizer *t, scratch *s, const unsigned char *w, size_t m, uint16_t *dst,
                     size_t *ndst) {
    if (m == 1) {
        dst[(*ndst)++] = t->byte_id[w[0]];
        return DT_OK;
    }
    DT_TRY(scratch_reserve(s, m));
    int32_t mi = (int32_t)m;
    for (int32_t i = 0; i < mi; i++) {
        s->id[i] = t->byte_id[w[i]];
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < mi ? i + 1 : -1;
    }
    s->hn = 0;
    for (int32_t i = 0; i + 1 < mi; i++) DT_TRY(push_pair(t, s, i));
    while (s->hn) {
        pair_ent top = heap_pop(s);
        if (!pair_live(s, &top)) continue;
        size_t nl = 0;
        s->list[nl++] = top.pos;
        while (s->hn && s->heap[0].rank == top.rank) {
            pair_ent e = heap_pop(s);
            if (pair_live(s, &e)) s->list[nl++] = e.pos;
        }
        if (nl > 1) qsort(s->list, nl, sizeof *s->list, cmp_i32);
        size_t nm = 0;
        for (size_t k = 0; k < nl; k++) {
            int32_t i = s->list[k];
            top.pos = i; /* top is the (a, b) template */
            if (!pair_live(s, &top)) continue; /* overlapped by the previous merge (a == b) */
            int32_t j = s->next[i], jn = s->next[j];
            s->id[i] = top.out;
            s->next[i] = jn;
            if (jn >= 0) s->prev[jn] = i;
            s->next[j] = -2;
            s->list[nm++] = i;
        }
        for (size_t k = 0; k < nm; k++) {
            int32_t i = s->list[k];
            if (s->prev[i] >= 0) DT_TRY(push_pair(t, s, s->prev[i]));
            if (s->next[i] >= 0) DT_TRY(push_pair(t, s, i));
        }
    }
    for (int32_t i = 0; i >= 0; i = s->next[i]) dst[(*ndst)++] = s->id[i];
    return DT_OK;
}

static dt_status reserve_tokens(uint16_t **buf, size_t *n, size_t *cap, size_t extra) {
    if (*n > *cap || (!*buf && *cap)) return dt_fail(DT_EINPUT, "tokenizer: inconsistent output buffer");
    if (*cap - *n >= extra) return DT_OK;
    if (extra > SIZE_MAX / 4 - *n) return dt_fail(DT_ERUNTIME, "tokenizer: output too large");
    size_t c = *cap ? *cap : 4096;
    while (c < *n + extra) c *= 2;
    uint16_t *p = realloc(*buf, c * sizeof *p);
    if (!p) return dt_fail(DT_ERUNTIME, "tokenizer: out of memory for %zu tokens", c);
    *buf = p;
    *cap = c;
    return DT_OK;
}

/* Length of a contraction ('s 't 're 've 'm 'll 'd, case-sensitive) at s[i] == '\'', or 0. */
static size_t contraction(const unsigned char *s, size_t n, size_t i) {
    if (i + 1 >= n) return 0;
    unsigned c = s[i + 1];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
    if (i + 2 >= n) return 0;
    unsigned d = s[i + 2];
    if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return 3;
    return 0;
}

/* End of the regex match starting at i; alternatives in the reference's order. */
static size_t pretoken_end(const unsigned char *s, size_t n, size_t i) {
    size_t w;
    uint32_t cp = utf8_at(s, n, i, &w);
    if (cp == '\'') {
        size_t k = contraction(s, n, i);
        if (k) return i + k;
    }
    /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': exactly one can apply, decided by the
     * first character after the optional space. */
    size_t j = i;
    uint32_t c = cp;
    if (cp == ' ' && i + 1 < n) {
        j = i + 1;
        c = utf8_at(s, n, j, &w);
    }
    int cls = cp_class(c);
    if (cls != C_SPACE) {
        size_t k = j + w;
        while (k < n) {
            uint32_t d = utf8_at(s, n, k, &w);
            if (cp_class(d) != cls) break;
            k += w;
        }
        return k;
    }
    /* '\s+(?!\S)' leaves the last space of a run for the next word; '\s+' takes a lone one. */
    size_t k = i, last = i;
    while (k < n) {
        uint32_t d = utf8_at(s, n, k, &w);
        if (cp_class(d) != C_SPACE) break;
        last = k;
        k += w;
    }
    return (k == n || last == i) ? k : last;
}

dt_status dt_tokenizer_encode(const dt_tokenizer *t, const char *text, size_t len, uint16_t **buf, size_t *n,
                              size_t *cap) {
    const unsigned char *s = (const unsigned char *)text;
    if (!t->bpe) {
        DT_TRY(reserve_tokens(buf, n, cap, len));
        for (size_t i = 0; i < len; i++) (*buf)[(*n)++] = s[i];
        return DT_OK;
    }
    scratch sc = {0};
    dt_status st = DT_OK;
    for (size_t i = 0; i < len && st == DT_OK;) {
        size_t end = pretoken_end(s, len, i);
        st = reserve_tokens(buf, n, cap, end - i);
        if (st == DT_OK) st = bpe(t, &sc, s + i, end - i, *buf, n);
        i = end;
    }
    scratch_free(&sc);
    return st;
}

size_t dt_tokenizer_decode(const dt_tokenizer *t, int token, char *out, size_t cap) {
    if (token < 0 || token >= t->vocab) return 0;
    if (!t->bpe) {
        if (cap < 1) return 0;
        out[0] = (char)token;
        return 1;
    }
    size_t k = t->off[token + 1] - t->off[token];
    if (k > cap) k = cap;
    memcpy(out, t->bytes + t->off[token], k);
    return k;
}
